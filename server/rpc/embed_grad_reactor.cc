#include "server/rpc/embed_grad_reactor.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/status_macros.h"
#include "server/base/status_mapping.h"
#include "server/handlers/staging.h"
#include "server/rpc/message_bytes.h"
#include "server/validate/request_fingerprint.h"
#include "server/validate/session_id.h"

namespace flce::server {

EmbedGradReactor::EmbedGradReactor(const ServiceContext& ctx, grpc::CallbackServerContext* call,
                                   grpc::ByteBuffer* response, Principal who,
                                   std::unique_ptr<RpcScope> scope)
    : ctx_(ctx), call_(call), response_(response), who_(std::move(who)), scope_(std::move(scope)) {
  StartRead(&request_);
}

void EmbedGradReactor::OnReadDone(bool ok) {
  // Staging waits and the scatter are engine work: never on gRPC's thread.
  ctx_.pool->Schedule([this, ok] {
    if (cancelled_.load() || call_->IsCancelled()) {
      End(absl::CancelledError("the client cancelled EmbedGrad"));
      return;
    }
    if (!ok) {
      // A half-close, a cancel and a broken stream look alike: only the end
      // message means "done", and the contribution lands only once the stream
      // has closed after it.
      End(ended_ ? Land()
                 : absl::InvalidArgumentError(
                       "the request stream ended without an end message (EmbedGradRequest.end): "
                       "nothing landed"));
      return;
    }
    absl::Status status = ParseAndHandle();
    if (!status.ok()) {
      End(status);
      return;
    }
    StartRead(&request_);
  });
}

void EmbedGradReactor::OnCancel() { cancelled_.store(true); }

void EmbedGradReactor::OnDone() { delete this; }

void EmbedGradReactor::End(const absl::Status& status) {
  if (slot_held_) {
    ctx_.sessions->AbortContribution(*session_, header_.request_id(), /*deferred=*/false);
    slot_held_ = false;
  }
  rows_.clear();
  rows_.shrink_to_fit();
  const absl::Status outcome = status.ok() ? SerializeMessageBytes(summary_, response_) : status;
  grpc::Status grpc_status = ToGrpcStatus(EngineStatus(*ctx_.engine, outcome));
  scope_->Done(grpc_status);
  Finish(grpc_status);
}

namespace {

// What a request message is, for status messages that say what arrived.
std::string Describe(const v1::EmbedGradRequest& request) {
  switch (request.msg_case()) {
    case v1::EmbedGradRequest::kHeader:
      return "a header";
    case v1::EmbedGradRequest::kRows:
      return absl::StrCat("gradient rows at token_offset ", request.rows().token_offset());
    case v1::EmbedGradRequest::kEnd:
      return absl::StrCat("an end message (end.num_tokens = ", request.end().num_tokens(), ")");
    default:
      return "a message holding none of header, rows or end";
  }
}

}  // namespace

absl::Status EmbedGradReactor::ParseAndHandle() {
  v1::EmbedGradRequest request;
  FLCE_RETURN_IF_ERROR(ParseRequestBytes(&request_, &request));
  return Handle(request);
}

absl::Status EmbedGradReactor::Handle(const v1::EmbedGradRequest& request) {
  if (ended_) return MessageAfterEndError("EmbedGradRequest.end", Describe(request));
  if (!have_header_) {
    if (!request.has_header()) {
      return absl::InvalidArgumentError(
          absl::StrCat("first message must be a header (got ", Describe(request), ")"));
    }
    have_header_ = true;
    return Setup(request.header());
  }
  switch (request.msg_case()) {
    case v1::EmbedGradRequest::kRows:
      return AddRows(request.rows());
    case v1::EmbedGradRequest::kEnd:
      ended_ = true;
      return CheckEnd(request.end());
    case v1::EmbedGradRequest::kHeader:
      return absl::InvalidArgumentError("header sent twice: only the first message is one");
    default:
      return absl::InvalidArgumentError("a request message holds none of header, rows or end");
  }
}

absl::Status EmbedGradReactor::Setup(const v1::EmbedGradHeader& header) {
  header_ = header;
  const std::string session_id = SessionIdOrDefault(header.session_id());
  scope_->set_request_id(header.request_id());
  scope_->set_head(header.head_id());
  scope_->set_session(session_id);
  scope_->set_tokens(header.num_tokens());
  FLCE_RETURN_IF_ERROR(ValidateId(header.head_id(), "head_id"));
  FLCE_RETURN_IF_ERROR(ValidateId(session_id, "session_id"));
  FLCE_RETURN_IF_ERROR(ValidateRequestId(header.request_id(), "request_id"));
  if (header.request_id().empty()) {
    return absl::InvalidArgumentError(
        "request_id is empty: EmbedGrad needs one, so that a retry never applies it twice");
  }
  FLCE_ASSIGN_OR_RETURN(head_, ctx_.heads->Get(who_.tenant, header.head_id()));
  if (header.has_expected_head_version() && header.expected_head_version() != head_.version) {
    return absl::FailedPreconditionError(absl::StrCat(
        "head \"", head_.head_id, "\" is at version ", head_.version,
        "; the request expects expected_head_version = ", header.expected_head_version()));
  }
  const HeadSpec& spec = head_.head->spec();
  if (header.num_tokens() < 1 || header.num_tokens() > ctx_.config.max_request_tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_tokens = ", header.num_tokens(),
                     " must be in [1, --max-request-tokens=", ctx_.config.max_request_tokens, "]"));
  }
  FLCE_ASSIGN_OR_RETURN(dtype_, DTypeFromProto(header.dtype(), "dtype"));
  FLCE_ASSIGN_OR_RETURN(
      ids_, ParseTokenIds(header.token_ids(), header.num_tokens(), ctx_.config.max_request_tokens,
                          spec.vocab_size, "token_ids"));
  if (header.has_padding_idx()) {
    const int64_t p = header.padding_idx();
    if (p < -spec.vocab_size || p >= spec.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("padding_idx = ", p, " is outside [",
                                                     -spec.vocab_size, ", ", spec.vocab_size, ")"));
    }
    // torch's convention: a negative index counts from the end.
    padding_idx_ = static_cast<int32_t>(p < 0 ? p + spec.vocab_size : p);
  }
  row_bytes_ = spec.hidden_size * DTypeSize(dtype_);
  tracker_.emplace(header.num_tokens(), "gradient");
  rows_.assign(header.num_tokens() * row_bytes_, '\0');
  FLCE_ASSIGN_OR_RETURN(session_,
                        ctx_.sessions->GetOrCreate(who_.tenant, head_.head_id, session_id, spec));
  FLCE_ASSIGN_OR_RETURN(begin_, ctx_.sessions->BeginContribution(*session_, header.request_id(),
                                                                 EmbedGradFingerprint(header),
                                                                 /*deferred=*/false));
  slot_held_ = !begin_.replay;
  if (ctx_.metrics != nullptr) {
    ctx_.metrics->AddReceivedBytes("EmbedGrad", static_cast<int64_t>(header.token_ids().size()));
  }
  return absl::OkStatus();
}

absl::Status EmbedGradReactor::AddRows(const v1::EmbedRows& rows) {
  FLCE_ASSIGN_OR_RETURN(
      int64_t n,
      tracker_->Accept(rows.token_offset(), static_cast<int64_t>(rows.data().size()), row_bytes_));
  FLCE_RETURN_IF_ERROR(CheckRowsFinite(dtype_, rows.data().data(), n,
                                       head_.head->spec().hidden_size, rows.token_offset(),
                                       "a gradient row"));
  std::memcpy(rows_.data() + rows.token_offset() * row_bytes_, rows.data().data(),
              rows.data().size());
  rows_fingerprint_ += HiddenFingerprint(rows.data().data(), n, row_bytes_, rows.token_offset());
  if (ctx_.metrics != nullptr) {
    ctx_.metrics->AddReceivedBytes("EmbedGrad", static_cast<int64_t>(rows.data().size()));
  }
  return absl::OkStatus();
}

absl::Status EmbedGradReactor::CheckEnd(const v1::EndOfInput& end) {
  if (end.num_tokens() != header_.num_tokens()) {
    return absl::InvalidArgumentError(absl::StrCat("end.num_tokens = ", end.num_tokens(),
                                                   " but the header's num_tokens is ",
                                                   header_.num_tokens()));
  }
  return tracker_->CheckComplete();
}

absl::Status EmbedGradReactor::Land() {
  const absl::Time start = absl::Now();
  summary_.set_head_version(head_.version);
  // Padding rows get no gradient: drop them (and their ids) in place.
  int64_t kept = 0;
  for (int64_t i = 0; i < header_.num_tokens(); ++i) {
    if (padding_idx_ && ids_[i] == *padding_idx_) continue;
    if (kept != i) {
      ids_[kept] = ids_[i];
      std::memcpy(rows_.data() + kept * row_bytes_, rows_.data() + i * row_bytes_, row_bytes_);
    }
    ++kept;
  }
  summary_.set_rows_applied(kept);
  if (begin_.replay) {
    if (begin_.first.hidden_fingerprint != rows_fingerprint_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "request id \"", header_.request_id(),
          "\" was used for an EmbedGrad call with other gradient rows: choose a new request id"));
    }
    summary_.set_replayed(true);
    summary_.set_committed(begin_.first.state == ContributionState::kCommitted);
    return absl::OkStatus();
  }
  double waited_ms = 0.0;
  FLCE_ASSIGN_OR_RETURN(
      StagedGrad staged,
      AcquireStaging(
          ctx_, head_.head->spec(), head_.version, absl::FromChrono(call_->deadline()),
          [this] {
            return call_->IsCancelled() ? absl::CancelledError("the client cancelled EmbedGrad")
                                        : absl::OkStatus();
          },
          &waited_ms));
  FLCE_RETURN_IF_ERROR(staged.grad->ScatterAddRows(ids_.data(), kept, rows_.data(), dtype_,
                                                   header_.deterministic()));
  // CompleteContribution releases the slot whatever it returns.
  slot_held_ = false;
  FLCE_RETURN_IF_ERROR(ctx_.sessions->CompleteContribution(*session_, header_.request_id(),
                                                           std::move(staged), /*deferred=*/false,
                                                           /*tokens=*/0, rows_fingerprint_));
  summary_.set_committed(true);
  v1::Timings* timings = summary_.mutable_timings();
  timings->set_wait_ms(waited_ms);
  timings->set_total_ms(absl::ToDoubleMilliseconds(absl::Now() - scope_->start()));
  timings->set_engine_ms(absl::ToDoubleMilliseconds(absl::Now() - start) - waited_ms);
  return absl::OkStatus();
}

}  // namespace flce::server
