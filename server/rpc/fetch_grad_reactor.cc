#include "server/rpc/fetch_grad_reactor.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "flce/v1/message_size.h"
#include "server/base/status_mapping.h"
#include "server/validate/session_id.h"
#include "server/validate/validation.h"

namespace flce::server {

FetchGradReactor::FetchGradReactor(const ServiceContext& ctx, const v1::FetchGradRequest* request,
                                   Principal who, std::unique_ptr<RpcScope> scope)
    : PooledWriteReactor(ctx, std::move(scope), "FetchGrad"),
      request_(*request),
      who_(std::move(who)) {
  request_.set_session_id(SessionIdOrDefault(request_.session_id()));
  this->scope().set_request_id(request_.request_id());
  this->scope().set_head(request_.head_id());
  this->scope().set_session(request_.session_id());
  Start();
}

void FetchGradReactor::Release() { snapshot_.grad.reset(); }

absl::Status FetchGradReactor::Prepare() {
  FLCE_RETURN_IF_ERROR(ValidateId(request_.head_id(), "head_id"));
  FLCE_RETURN_IF_ERROR(ValidateRequestId(request_.request_id(), "request_id"));
  FLCE_RETURN_IF_ERROR(ValidateId(request_.session_id(), "session_id"));
  switch (request_.dtype()) {
    case v1::DTYPE_UNSPECIFIED:
    case v1::DTYPE_FP32:
      dtype_ = DType::kF32;
      break;
    case v1::DTYPE_BF16:
      dtype_ = DType::kBF16;
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("dtype = ", EnumValueText(v1::DType_descriptor(), request_.dtype()),
                       " is not DTYPE_FP32 or DTYPE_BF16"));
  }
  if (request_.chunk_rows() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk_rows = ", request_.chunk_rows(), " is negative"));
  }
  uint64_t version = 0;
  if (absl::StatusOr<HeadEntry> head = ctx_.heads->Get(who_.tenant, request_.head_id());
      head.ok()) {
    version = head->version;
  }
  FLCE_ASSIGN_OR_RETURN(
      snapshot_, ctx_.sessions->Snapshot(who_.tenant, request_.head_id(), request_.session_id(),
                                         request_.reset(), request_.request_id()));
  const GradBuffer& grad = *snapshot_.grad;
  int64_t row_bytes = grad.hidden_size() * DTypeSize(dtype_);
  // What the client receives is bounded by --max-response-mb (a stock gRPC
  // client takes 4 MiB), not by what the server accepts: chunk_rows is only
  // an upper bound.
  int64_t fit = ItemsPerMessage(ctx_.config.max_response_bytes, row_bytes);
  chunk_rows_ = request_.chunk_rows() > 0 ? std::min(request_.chunk_rows(), fit) : fit;
  bias_chunk_ = ItemsPerMessage(ctx_.config.max_response_bytes, DTypeSize(dtype_));
  v1::GradHeader* header = response().mutable_header();
  header->set_vocab_size(grad.vocab_size());
  header->set_hidden_size(grad.hidden_size());
  header->set_dtype(DTypeToProto(dtype_));
  header->set_has_bias(grad.has_bias());
  header->set_contributions(snapshot_.contributions);
  header->set_head_version(version);
  header->mutable_computed_on()->set_oldest(snapshot_.computed_on.oldest);
  header->mutable_computed_on()->set_newest(snapshot_.computed_on.newest);
  header->set_replayed(snapshot_.replayed);
  return absl::OkStatus();
}

absl::StatusOr<bool> FetchGradReactor::Next() {
  const GradBuffer& grad = *snapshot_.grad;
  response().Clear();
  v1::GradChunk* chunk = response().mutable_chunk();
  if (next_row_ < grad.vocab_size()) {
    int64_t rows = std::min(chunk_rows_, grad.vocab_size() - next_row_);
    std::string* data = chunk->mutable_data();
    data->resize(rows * grad.hidden_size() * DTypeSize(dtype_));
    FLCE_RETURN_IF_ERROR(grad.CopyWeightRows(next_row_, rows, dtype_, data->data()));
    chunk->set_role(v1::TENSOR_WEIGHT);
    chunk->set_row_offset(next_row_);
    chunk->set_rows(rows);
    next_row_ += rows;
    if (ctx_.metrics != nullptr) {
      ctx_.metrics->AddSentBytes("FetchGrad", static_cast<int64_t>(data->size()));
    }
    return true;
  }
  if (grad.has_bias() && next_bias_ < grad.vocab_size()) {
    int64_t count = std::min(bias_chunk_, grad.vocab_size() - next_bias_);
    std::string* data = chunk->mutable_data();
    data->resize(count * DTypeSize(dtype_));
    FLCE_RETURN_IF_ERROR(grad.CopyBias(next_bias_, count, dtype_, data->data()));
    chunk->set_role(v1::TENSOR_BIAS);
    chunk->set_row_offset(next_bias_);
    chunk->set_rows(count);
    next_bias_ += count;
    if (ctx_.metrics != nullptr) {
      ctx_.metrics->AddSentBytes("FetchGrad", static_cast<int64_t>(data->size()));
    }
    return true;
  }
  return false;
}

}  // namespace flce::server
