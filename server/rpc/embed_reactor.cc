#include "server/rpc/embed_reactor.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "flce/v1/message_size.h"
#include "server/base/status_mapping.h"
#include "server/validate/validation.h"

namespace flce::server {

EmbedReactor::EmbedReactor(const ServiceContext& ctx, const v1::EmbedRequest* request,
                           Principal who, std::unique_ptr<RpcScope> scope)
    : PooledWriteReactor(ctx, std::move(scope), "Embed"), request_(*request), who_(std::move(who)) {
  this->scope().set_head(request_.head_id());
  Start();
}

void EmbedReactor::Release() { head_ = HeadEntry{}; }

absl::Status EmbedReactor::Prepare() {
  FLCE_RETURN_IF_ERROR(ValidateId(request_.head_id(), "head_id"));
  if (request_.chunk_rows() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk_rows = ", request_.chunk_rows(), " is negative"));
  }
  FLCE_ASSIGN_OR_RETURN(head_, ctx_.heads->Get(who_.tenant, request_.head_id()));
  if (request_.has_expected_head_version() && request_.expected_head_version() != head_.version) {
    return absl::FailedPreconditionError(absl::StrCat(
        "head \"", head_.head_id, "\" is at version ", head_.version,
        "; the request expects expected_head_version = ", request_.expected_head_version()));
  }
  const HeadSpec& spec = head_.head->spec();
  if (request_.dtype() == v1::DTYPE_UNSPECIFIED) {
    dtype_ = spec.dtype;
  } else {
    FLCE_ASSIGN_OR_RETURN(dtype_, DTypeFromProto(request_.dtype(), "dtype"));
    if (dtype_ != spec.dtype && dtype_ != DType::kF32) {
      return absl::InvalidArgumentError(absl::StrCat("dtype = ", DTypeName(dtype_),
                                                     ": rows come in the head's dtype (",
                                                     DTypeName(spec.dtype), ") or fp32"));
    }
  }
  FLCE_ASSIGN_OR_RETURN(
      ids_, ParseTokenIds(request_.token_ids(), -1, ctx_.config.max_request_tokens, spec.vocab_size,
                          "token_ids"));
  this->scope().set_tokens(static_cast<int64_t>(ids_.size()));
  const int64_t fit =
      ItemsPerMessage(ctx_.config.max_response_bytes, spec.hidden_size * DTypeSize(dtype_));
  chunk_rows_ = request_.chunk_rows() > 0 ? std::min(request_.chunk_rows(), fit) : fit;
  v1::EmbedHeader* header = response().mutable_header();
  header->set_num_tokens(static_cast<int64_t>(ids_.size()));
  header->set_hidden_size(spec.hidden_size);
  header->set_dtype(DTypeToProto(dtype_));
  header->set_head_version(head_.version);
  return absl::OkStatus();
}

absl::StatusOr<bool> EmbedReactor::Next() {
  const int64_t n = static_cast<int64_t>(ids_.size());
  if (next_ >= n) return false;
  const int64_t rows = std::min(chunk_rows_, n - next_);
  const HeadSpec& spec = head_.head->spec();
  response().Clear();
  v1::EmbedRows* out = response().mutable_rows();
  std::string* data = out->mutable_data();
  data->resize(rows * spec.hidden_size * DTypeSize(dtype_));
  {
    // Read while no step rewrites the weight, and only the header's version.
    FLCE_ASSIGN_OR_RETURN(HeadGate::Use use,
                          head_.training->gate().Enter(absl::InfiniteFuture(), [this]() {
                            return cancelled() ? absl::CancelledError("the client cancelled Embed")
                                               : absl::OkStatus();
                          }));
    FLCE_ASSIGN_OR_RETURN(HeadEntry now, ctx_.heads->Get(who_.tenant, head_.head_id));
    if (now.training != head_.training || now.version != head_.version) {
      return absl::AbortedError(absl::StrCat("head \"", head_.head_id,
                                             "\" changed during the call (version ", head_.version,
                                             " -> ", now.version, "): embed again"));
    }
    FLCE_RETURN_IF_ERROR(head_.head->GatherRows(ids_.data() + next_, rows, dtype_, data->data()));
  }
  out->set_token_offset(next_);
  out->set_num_tokens(rows);
  next_ += rows;
  if (ctx_.metrics != nullptr) {
    ctx_.metrics->AddSentBytes("Embed", static_cast<int64_t>(data->size()));
  }
  return true;
}

}  // namespace flce::server
