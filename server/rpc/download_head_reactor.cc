#include "server/rpc/download_head_reactor.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "flce/v1/message_size.h"
#include "server/base/status_mapping.h"
#include "server/handlers/head_info.h"
#include "server/validate/validation.h"

namespace flce::server {

DownloadHeadReactor::DownloadHeadReactor(const ServiceContext& ctx,
                                         const v1::DownloadHeadRequest* request, Principal who,
                                         std::unique_ptr<RpcScope> scope)
    : PooledWriteReactor(ctx, std::move(scope), "DownloadHead"),
      request_(*request),
      who_(std::move(who)) {
  this->scope().set_head(request_.head_id());
  Start();
}

void DownloadHeadReactor::Release() { head_ = HeadEntry{}; }

absl::Status DownloadHeadReactor::Prepare() {
  FLCE_RETURN_IF_ERROR(ValidateId(request_.head_id(), "head_id"));
  if (request_.chunk_rows() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk_rows = ", request_.chunk_rows(), " is negative"));
  }
  FLCE_ASSIGN_OR_RETURN(head_, ctx_.heads->Get(who_.tenant, request_.head_id()));
  const HeadSpec& spec = head_.head->spec();
  dtype_ = request_.master() ? DType::kF32 : spec.dtype;
  const int64_t row_bytes = spec.hidden_size * DTypeSize(dtype_);
  const int64_t fit = ItemsPerMessage(ctx_.config.max_response_bytes, row_bytes);
  chunk_rows_ = request_.chunk_rows() > 0 ? std::min(request_.chunk_rows(), fit) : fit;
  bias_chunk_ = ItemsPerMessage(ctx_.config.max_response_bytes, DTypeSize(dtype_));
  v1::DownloadHeader* header = response().mutable_header();
  FillHeadInfo(head_, ctx_.sessions->Count(who_.tenant, head_.head_id), header->mutable_head());
  header->set_dtype(DTypeToProto(dtype_));
  return absl::OkStatus();
}

absl::Status DownloadHeadReactor::CopyElements(HeadTensor tensor, int64_t begin, int64_t count,
                                               char* out) {
  HeadTrainingState& training = *head_.training;
  // Steps hold this lock while they rewrite the weight and bump the version.
  absl::MutexLock lock(&training.mu());
  FLCE_ASSIGN_OR_RETURN(HeadEntry now, ctx_.heads->Get(who_.tenant, head_.head_id));
  if (now.training != head_.training || now.version != head_.version) {
    return absl::AbortedError(
        absl::StrCat("head \"", head_.head_id, "\" changed during the download (version ",
                     head_.version, " -> ", now.version, "): download again"));
  }
  if (!request_.master()) return head_.head->CopyOut(tensor, begin, count, out);
  float* floats = reinterpret_cast<float*>(out);
  if (HeadOptimizer* optimizer = training.optimizer(); optimizer != nullptr) {
    return optimizer->ReadState(tensor, OptimizerTensor::kMaster, begin, count, floats);
  }
  // No optimizer state: the master a step would start from, the weight widened.
  const DType dtype = head_.head->spec().dtype;
  std::string narrow(count * DTypeSize(dtype), '\0');
  FLCE_RETURN_IF_ERROR(head_.head->CopyOut(tensor, begin, count, narrow.data()));
  ToFloat(dtype, narrow.data(), floats, count);
  return absl::OkStatus();
}

absl::StatusOr<bool> DownloadHeadReactor::Next() {
  const HeadSpec& spec = head_.head->spec();
  response().Clear();
  v1::GradChunk* chunk = response().mutable_chunk();
  const int64_t size = DTypeSize(dtype_);
  if (next_row_ < spec.vocab_size) {
    const int64_t rows = std::min(chunk_rows_, spec.vocab_size - next_row_);
    std::string* data = chunk->mutable_data();
    data->resize(rows * spec.hidden_size * size);
    FLCE_RETURN_IF_ERROR(CopyElements(HeadTensor::kWeight, next_row_ * spec.hidden_size,
                                      rows * spec.hidden_size, data->data()));
    chunk->set_role(v1::TENSOR_WEIGHT);
    chunk->set_row_offset(next_row_);
    chunk->set_rows(rows);
    next_row_ += rows;
  } else if (spec.has_bias && next_bias_ < spec.vocab_size) {
    const int64_t count = std::min(bias_chunk_, spec.vocab_size - next_bias_);
    std::string* data = chunk->mutable_data();
    data->resize(count * size);
    FLCE_RETURN_IF_ERROR(CopyElements(HeadTensor::kBias, next_bias_, count, data->data()));
    chunk->set_role(v1::TENSOR_BIAS);
    chunk->set_row_offset(next_bias_);
    chunk->set_rows(count);
    next_bias_ += count;
  } else {
    return false;
  }
  if (ctx_.metrics != nullptr) {
    ctx_.metrics->AddSentBytes("DownloadHead", static_cast<int64_t>(chunk->data().size()));
  }
  return true;
}

}  // namespace flce::server
