#include "server/rpc/upload_reactor.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "server/base/status_mapping.h"
#include "server/handlers/head_info.h"
#include "server/state/head_registry.h"
#include "server/validate/validation.h"

namespace flce::server {

UploadHeadReactor::UploadHeadReactor(const ServiceContext& ctx, grpc::CallbackServerContext* call,
                                     v1::HeadInfo* response, Principal who,
                                     std::unique_ptr<RpcScope> scope)
    : ctx_(ctx), call_(call), response_(response), who_(std::move(who)), scope_(std::move(scope)) {
  StartRead(&request_);
}

void UploadHeadReactor::OnReadDone(bool ok) {
  // Head writes are engine work (a device copy): never on gRPC's thread.
  ctx_.pool->Schedule([this, ok] {
    if (cancelled_.load() || call_->IsCancelled()) {
      End(absl::CancelledError("the client cancelled the upload"));
      return;
    }
    absl::Status status = ok ? Handle(request_) : Complete();
    if (!ok || !status.ok()) {
      End(status);
      return;
    }
    StartRead(&request_);
  });
}

void UploadHeadReactor::OnCancel() { cancelled_.store(true); }

void UploadHeadReactor::OnDone() { delete this; }

void UploadHeadReactor::End(const absl::Status& status) {
  builder_.reset();  // a partial head is dropped with its memory
  reservation_ = UploadBudget::Reservation();
  grpc::Status grpc_status = ToGrpcStatus(EngineStatus(*ctx_.engine, status));
  scope_->Done(grpc_status);
  Finish(grpc_status);
}

absl::Status UploadHeadReactor::Handle(const v1::UploadHeadRequest& request) {
  if (!have_header_) {
    if (!request.has_header()) {
      return absl::InvalidArgumentError("first message must be a header");
    }
    FLCE_ASSIGN_OR_RETURN(spec_, HeadSpecFromUpload(request.header()));
    head_id_ = request.header().head_id();
    reset_optimizer_ = request.header().reset_optimizer();
    scope_->set_head(head_id_);
    FLCE_ASSIGN_OR_RETURN(owner_, ctx_.heads->WriteOwner(who_.tenant, who_.admin, head_id_));
    // Limits and shape first: a head that cannot be kept is refused before
    // its bytes travel.
    FLCE_RETURN_IF_ERROR(
        ctx_.heads->CheckPut(owner_, head_id_, spec_, ResetOptimizer(reset_optimizer_)));
    // The header alone must not be able to take memory: what unfinished
    // uploads hold is bounded before the engine allocates anything.
    FLCE_ASSIGN_OR_RETURN(reservation_, ctx_.uploads->Reserve(head_id_, HeadBytes(spec_)));
    FLCE_ASSIGN_OR_RETURN(builder_, ctx_.engine->BeginHead(spec_));
    have_header_ = true;
    return absl::OkStatus();
  }
  if (request.has_header()) {
    return absl::InvalidArgumentError("header sent twice: only the first message is one");
  }
  const v1::TensorChunk& chunk = request.chunk();
  bool bias = chunk.role() == v1::TENSOR_BIAS;
  if (chunk.role() != v1::TENSOR_WEIGHT && !bias) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk role = ", static_cast<int>(chunk.role()), " is unknown"));
  }
  if (bias && !spec_.has_bias) {
    return absl::InvalidArgumentError("a bias chunk arrived but the header says has_bias = false");
  }
  int64_t& received = bias ? bias_received_ : weight_received_;
  int64_t expected =
      (bias ? spec_.vocab_size : spec_.vocab_size * spec_.hidden_size) * DTypeSize(spec_.dtype);
  const char* name = bias ? "bias" : "weight";
  if (chunk.byte_offset() != received) {
    return absl::InvalidArgumentError(absl::StrCat(name, " chunk has byte_offset ",
                                                   chunk.byte_offset(), "; expected ", received,
                                                   " (chunks arrive in order, without gaps)"));
  }
  int64_t bytes = static_cast<int64_t>(chunk.data().size());
  if (received + bytes > expected) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, " bytes: expected ", expected, " (", spec_.vocab_size,
                     bias ? "" : absl::StrCat(" x ", spec_.hidden_size), " x ",
                     DTypeName(spec_.dtype), "), got at least ", received + bytes));
  }
  if (bias) {
    FLCE_RETURN_IF_ERROR(builder_->WriteBias(received, chunk.data().data(), bytes));
  } else {
    FLCE_RETURN_IF_ERROR(builder_->WriteWeight(received, chunk.data().data(), bytes));
  }
  received += bytes;
  if (ctx_.metrics != nullptr) ctx_.metrics->AddReceivedBytes("UploadHead", bytes);
  return absl::OkStatus();
}

absl::Status UploadHeadReactor::Complete() {
  if (!have_header_) {
    return absl::InvalidArgumentError(
        "first message must be a header (the stream closed before any message)");
  }
  int64_t weight_expected = spec_.vocab_size * spec_.hidden_size * DTypeSize(spec_.dtype);
  if (weight_received_ != weight_expected) {
    return absl::InvalidArgumentError(absl::StrCat(
        "weight bytes: expected ", weight_expected, " (", spec_.vocab_size, " x ",
        spec_.hidden_size, " x ", DTypeName(spec_.dtype), "), got ", weight_received_));
  }
  int64_t bias_expected = spec_.has_bias ? spec_.vocab_size * DTypeSize(spec_.dtype) : 0;
  if (bias_received_ != bias_expected) {
    return absl::InvalidArgumentError(absl::StrCat("bias bytes: expected ", bias_expected, " (",
                                                   spec_.vocab_size, " x ", DTypeName(spec_.dtype),
                                                   "), got ", bias_received_));
  }
  FLCE_ASSIGN_OR_RETURN(std::shared_ptr<const Head> head, builder_->Finish());
  builder_.reset();
  FLCE_ASSIGN_OR_RETURN(HeadEntry entry,
                        ctx_.heads->Put(owner_, head_id_, std::move(head), "upload",
                                        ResetOptimizer(reset_optimizer_)));
  FillHeadInfo(entry, ctx_.sessions->Count(who_.tenant, head_id_), response_);
  return absl::OkStatus();
}

}  // namespace flce::server
