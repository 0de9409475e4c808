#include "server/handlers/compute_job.h"

#include <algorithm>
#include <atomic>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/status_macros.h"
#include "flce/v1/message_size.h"
#include "server/base/guarded_copy.h"
#include "server/base/receive_buffers.h"
#include "server/handlers/staging.h"
#include "server/state/local_peers.h"
#include "server/validate/hidden_rows_check.h"
#include "server/validate/request_fingerprint.h"
#include "server/validate/session_id.h"
#include "server/validate/validation.h"

namespace flce::server {
namespace {

std::string AnonymousRequestId(const std::string& instance_id) {
  static std::atomic<uint64_t> counter{0};
  return absl::StrCat("anonymous-", instance_id, "-", counter.fetch_add(1));
}

// What a request message is, for status messages that say what arrived.
std::string Describe(const v1::ComputeRequest& request) {
  switch (request.msg_case()) {
    case v1::ComputeRequest::kHeader:
      return "a header";
    case v1::ComputeRequest::kHidden:
      return absl::StrCat("a hidden chunk at token_offset ", request.hidden().token_offset());
    case v1::ComputeRequest::kEnd:
      return absl::StrCat("an end message (end.num_tokens = ", request.end().num_tokens(), ")");
    default:
      return "a message holding none of header, hidden or end";
  }
}

}  // namespace

ComputeJob::ComputeJob(const ServiceContext& ctx, ComputeChannel* channel, const Principal& who,
                       RpcScope* scope)
    : ctx_(ctx), channel_(channel), who_(who), scope_(scope), start_(scope->start()) {}

ComputeJob::~ComputeJob() { Abandon(); }

void ComputeJob::Abandon() {
  // The engine call first: it may still be writing into the staging buffer
  // and handing grad_input to the sender.
  call_.reset();
  grad_input_.reset();
  head_use_.Release();
  if (slot_held_) {
    ctx_.sessions->AbortContribution(*session_, request_id_, deferred_);
    slot_held_ = false;
  }
  staging_ = StagedGrad{};
}

absl::Status ComputeJob::Run() {
  FLCE_ASSIGN_OR_RETURN(std::optional<v1::ComputeRequest> first, channel_->Next());
  scope_->mark_phase("header");
  if (!first.has_value()) {
    return absl::InvalidArgumentError(
        "first message must be a header (the stream closed before any message)");
  }
  if (!first->has_header()) {
    return absl::InvalidArgumentError(
        absl::StrCat("first message must be a header (got ", Describe(*first), ")"));
  }
  absl::Status status = Setup(first->header());
  if (status.ok()) status = OpenPieces(first->header());
  if (status.ok()) scope_->mark_phase("setup");
  if (status.ok() && region_ != nullptr) {
    status = region_->device() != nullptr ? AddRowsFromDevice() : AddRowsFromRegion();
  }
  bool ended = false;
  while (status.ok() && !ended) {
    absl::StatusOr<std::optional<v1::ComputeRequest>> next = channel_->Next();
    if (!next.ok()) {
      status = next.status();
      break;
    }
    if (!next->has_value()) {
      // A half-close, a cancel and a broken connection all look like this
      // (a message that does not parse is an error of its own): only the end
      // message means "done".
      status = absl::InvalidArgumentError(absl::StrCat(
          "the request stream ended without an end message (ComputeRequest.end) after ",
          rows_->received(), " of num_tokens = ", spec_.num_tokens,
          " hidden rows: nothing landed; send ComputeRequest{end: {num_tokens}} after the last "
          "hidden chunk"));
      break;
    }
    switch ((*next)->msg_case()) {
      case v1::ComputeRequest::kHidden:
        status = region_ != nullptr
                     ? absl::InvalidArgumentError(
                           "a hidden chunk in a call whose hidden is in a region "
                           "(ComputeHeader.shared): send only the header and the end message")
                     : AddChunk((*next)->hidden());
        // The engine has the rows: the data plane's buffer serves a later frame
        // (a message's was parsed by gRPC, which would never take it back).
        if (header_.data_plane()) {
          ReceiveBuffers::Shared().Return(std::move(*(*next)->mutable_hidden()->mutable_data()));
        }
        break;
      case v1::ComputeRequest::kEnd:
        status = Complete((*next)->end());
        ended = true;
        break;
      case v1::ComputeRequest::kHeader:
        status = absl::InvalidArgumentError("header sent twice: only the first message is one");
        break;
      default:
        status =
            absl::InvalidArgumentError("a request message holds none of header, hidden or end");
    }
  }
  if (!status.ok()) Abandon();
  return EngineStatus(*ctx_.engine, status);
}

absl::Status ComputeJob::Setup(const v1::ComputeHeader& header) {
  header_ = header;
  scope_->set_request_id(header.request_id());
  scope_->set_head(header.head_id());
  scope_->set_session(SessionIdOrDefault(header.session_id()));
  scope_->set_tokens(header.num_tokens());
  FLCE_RETURN_IF_ERROR(ValidateId(header.head_id(), "head_id"));
  FLCE_RETURN_IF_ERROR(ValidateRequestId(header.request_id(), "request_id"));
  FLCE_ASSIGN_OR_RETURN(head_, ctx_.heads->Get(who_.tenant, header.head_id()));
  FLCE_RETURN_IF_ERROR(EnterHead(header.head_id()));
  if (header.has_expected_head_version() && header.expected_head_version() != head_.version) {
    return absl::FailedPreconditionError(absl::StrCat(
        "head \"", head_.head_id, "\" is at version ", head_.version,
        "; the request expects expected_head_version = ", header.expected_head_version()));
  }
  const HeadSpec& head_spec = head_.head->spec();
  if (header_.has_shared() && header_.shared().has_targets_offset()) {
    FLCE_RETURN_IF_ERROR(TakeTargetsFromRegion());
  }
  FLCE_ASSIGN_OR_RETURN(
      spec_,
      ComputeSpecFromHeader(header_, head_spec, ComputeLimits{ctx_.config.max_request_tokens}));
  if (spec_.policy.has_value() && !ctx_.engine->info().policy_objectives) {
    return absl::FailedPreconditionError(absl::StrCat(
        "this server's engine (", ctx_.engine->info().name,
        ") does not compute policy objectives: ServerInfo.capabilities has no "
        "\"policy_objectives\""));
  }
  row_bytes_ = head_spec.hidden_size * DTypeSize(spec_.hidden_dtype);
  spec_.wire_paced = !header.has_shared();
  spec_.hidden_checked = true;  // AddRows checks every host row before the engine gets it
  if (ctx_.metrics != nullptr) {
    ctx_.metrics->AddReceivedBytes(
        "Compute", static_cast<int64_t>(header.targets().size() + header.token_weights().size() +
                                        header.entropy_weights().size() +
                                        header.policy().ByteSizeLong() +
                                        header.preference().ByteSizeLong()));
  }
  rows_.emplace(spec_.num_tokens, "hidden");
  if (header.has_shared()) FLCE_RETURN_IF_ERROR(OpenSharedRegion(header.shared()));
  forward_only_ = header.outputs().forward_only();
  deferred_ = header.commit() == v1::COMMIT_DEFERRED;
  request_id_ = header.request_id();
  if (request_id_.empty()) {
    if (deferred_ && !forward_only_) {
      return absl::InvalidArgumentError(
          "request_id is empty: COMMIT_DEFERRED needs it to name the contribution in Commit");
    }
    request_id_ = AnonymousRequestId(ctx_.instance_id);
  }
  // An empty session id is the "default" session, so that a first call needs
  // nothing but a head and data.
  session_id_ = SessionIdOrDefault(header.session_id());
  FLCE_RETURN_IF_ERROR(ValidateId(session_id_, "session_id"));

  if (!forward_only_) {
    FLCE_ASSIGN_OR_RETURN(
        session_, ctx_.sessions->GetOrCreate(who_.tenant, head_.head_id, session_id_, head_spec));
    FLCE_ASSIGN_OR_RETURN(
        begin_, ctx_.sessions->BeginContribution(*session_, request_id_, ComputeFingerprint(header_),
                                                 deferred_));
    if (!begin_.replay) {
      slot_held_ = true;
      FLCE_RETURN_IF_ERROR(TakeStaging(head_spec));
    }
  }
  if (spec_.outputs.grad_input && spec_.grad_input_peer == nullptr) {
    grad_input_ =
        std::make_unique<GradInputSender>(spec_.hidden_dtype, head_spec.hidden_size,
                                          [this](int64_t offset, int64_t rows, std::string data) {
                                            SendGradInput(offset, rows, std::move(data));
                                          });
  }
  FLCE_ASSIGN_OR_RETURN(
      call_, StartComputeCall(*ctx_.engine, head_.head, spec_,
                                       [this](int64_t offset, int64_t rows, std::string data) {
                                         // Engines call it only when grad_input is asked for.
                                         if (grad_input_) {
                                           grad_input_->Post(offset, rows, std::move(data));
                                         }
                                       }));
  RecordTransport();
  return absl::OkStatus();
}

void ComputeJob::RecordTransport() {
  std::string transport;
  std::string reason = "region";
  if (region_ != nullptr && header_.has_shared()) {
    transport = region_->base() == nullptr ? "cuda_ipc" : "shm";
  } else {
    transport = header_.data_plane()                 ? "data_plane"
                : IsUnixSocketPeer(scope_->peer()) ? "messages_unix_socket"
                                                   : "messages_tcp";
    reason = MessagesReasonLabel(header_.messages_reason());
  }
  scope_->set_transport(transport);
  if (ctx_.metrics != nullptr) ctx_.metrics->RecordComputeTransport(transport, reason);
}

absl::Status ComputeJob::OpenPieces(const v1::ComputeHeader& header) {
  const int64_t pieces = header.hidden_pieces();
  if (pieces == 0 && !header.data_plane()) return absl::OkStatus();
  if (pieces < 0 || pieces > ComputePieces::kMaxPiecesPerCall) {
    return absl::InvalidArgumentError(absl::StrCat("hidden_pieces = ", pieces, ": must be in [0, ",
                                                   ComputePieces::kMaxPiecesPerCall, "]"));
  }
  if (header.data_plane() && pieces != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data_plane with hidden_pieces = ", pieces,
        ": the data-plane connection carries the rows that pieces would; ask for one or the other"));
  }
  const char* asked = header.data_plane() ? "data_plane" : "hidden_pieces";
  if (region_ != nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(asked, " in a call whose hidden is in a region (ComputeHeader.shared): a "
                            "region carries every row"));
  }
  if (header.data_plane() && ctx_.data_plane_port == 0) {
    return absl::FailedPreconditionError(
        "data_plane: this server has no data plane (started without --data-port; "
        "GetServerInfo.data_plane_port is 0): send hidden in messages");
  }
  FLCE_ASSIGN_OR_RETURN(std::string token,
                        channel_->OpenPieces(header.data_plane() ? 1 : static_cast<int>(pieces),
                                             row_bytes_, spec_.num_tokens, header.data_plane()));
  if (header.data_plane()) data_plane_token_ = token;
  auto opened = std::make_unique<v1::ComputeResponse>();
  opened->mutable_pieces()->set_token(std::move(token));
  channel_->Send(std::move(opened));
  return absl::OkStatus();
}

absl::Status ComputeJob::EnterHead(const std::string& head_id) {
  const absl::Time asked = absl::Now();
  for (;;) {
    FLCE_ASSIGN_OR_RETURN(HeadGate::Use use,
                          head_.training->gate().Enter(channel_->Deadline(),
                                                       [this] { return channel_->CheckAlive(); }));
    // An optimizer step may have run while this call waited: the call
    // computes on the weight (and reports the version) as it is now.
    FLCE_ASSIGN_OR_RETURN(HeadEntry now, ctx_.heads->Get(who_.tenant, head_id));
    const bool same = now.training == head_.training;
    head_ = std::move(now);
    if (same) {
      head_use_ = std::move(use);
      break;
    }
  }
  gate_wait_ms_ = absl::ToDoubleMilliseconds(absl::Now() - asked);
  return absl::OkStatus();
}

absl::Status ComputeJob::TakeStaging(const HeadSpec& head_spec) {
  FLCE_ASSIGN_OR_RETURN(staging_,
                        AcquireStaging(
                            ctx_, head_spec, head_.version, channel_->Deadline(),
                            [this] { return channel_->CheckAlive(); }, &staging_wait_ms_));
  spec_.grad_out = staging_.grad.get();
  return absl::OkStatus();
}

absl::Status ComputeJob::AddChunk(const v1::HiddenChunk& chunk) {
  if (ctx_.metrics != nullptr) {
    ctx_.metrics->AddReceivedBytes("Compute", static_cast<int64_t>(chunk.data().size()));
  }
  return AddRows(chunk.token_offset(), chunk.data());
}

absl::Status ComputeJob::AddRows(int64_t token_offset, absl::string_view data) {
  FLCE_ASSIGN_OR_RETURN(int64_t rows,
                        rows_->Accept(token_offset, static_cast<int64_t>(data.size()), row_bytes_));
  const int64_t hidden = head_.head->spec().hidden_size;
  const HiddenRowsCheck check = CheckHiddenRows(spec_.hidden_dtype, data.data(), rows, hidden,
                                                token_offset, session_ != nullptr);
  if (check.first_non_finite >= 0) {
    return NonFiniteRowError("hidden", token_offset + check.first_non_finite / hidden,
                             check.first_non_finite % hidden);
  }
  FLCE_RETURN_IF_ERROR(GradInputStatus());
  // Wrapping sums: the same rows give the same total in any order and chunking.
  hidden_fingerprint_ += check.fingerprint;
  FLCE_RETURN_IF_ERROR(channel_->WaitForRoom());
  return call_->AddHidden(token_offset, rows, data.data());
}

absl::Status ComputeJob::FindRegion(const v1::SharedHidden& shared) {
  if (region_ != nullptr) return absl::OkStatus();
  if (ctx_.regions == nullptr) {
    return absl::FailedPreconditionError(
        "ComputeHeader.shared: this server takes no regions (start it with "
        "--local-transports=shm or cuda_ipc); send hidden in messages");
  }
  FLCE_ASSIGN_OR_RETURN(region_, ctx_.regions->Find(who_.tenant, shared.region_id()));
  return absl::OkStatus();
}

absl::Status ComputeJob::TakeTargetsFromRegion() {
  const v1::SharedHidden& shared = header_.shared();
  if (!header_.targets().empty()) {
    return absl::InvalidArgumentError(
        "ComputeHeader.targets must be empty when shared.targets_offset names them in the "
        "region");
  }
  const int64_t n = header_.num_tokens();
  // Out of range: left empty, for ComputeSpecFromHeader to say what is wrong.
  if (n <= 0 || n > ctx_.config.max_request_tokens) return absl::OkStatus();
  FLCE_RETURN_IF_ERROR(FindRegion(shared));
  const int64_t bytes = n * int64_t{4};
  FLCE_RETURN_IF_ERROR(region_->CheckRange(shared.targets_offset(), bytes, "shared.targets_offset"));
  std::string* targets = header_.mutable_targets();
  targets->resize(static_cast<size_t>(bytes));
  if (region_->base() != nullptr) {
    FLCE_RETURN_IF_ERROR(
        GuardedCopy(targets->data(), region_->base() + shared.targets_offset(), targets->size()));
  } else {
    FLCE_RETURN_IF_ERROR(ctx_.engine->ReadPeerMemory(*region_->device(), shared.targets_offset(),
                                                     bytes, targets->data()));
  }
  AddLocalTransportBytes("in", bytes);
  return absl::OkStatus();
}

absl::Status ComputeJob::OpenSharedRegion(const v1::SharedHidden& shared) {
  FLCE_RETURN_IF_ERROR(FindRegion(shared));
  const int64_t bytes = spec_.num_tokens * row_bytes_;
  hidden_offset_ = shared.hidden_offset();
  FLCE_RETURN_IF_ERROR(region_->CheckRange(hidden_offset_, bytes, "shared.hidden_offset"));
  if (spec_.outputs.grad_input) {
    grad_input_offset_ = shared.grad_input_offset();
    FLCE_RETURN_IF_ERROR(
        region_->CheckRange(grad_input_offset_, bytes, "shared.grad_input_offset"));
    // grad_input is written while the call runs: nothing it reads may lie under it.
    auto apart = [&](const char* what, int64_t offset, int64_t length) {
      if (bytes == 0 || length == 0 || grad_input_offset_ >= offset + length ||
          offset >= grad_input_offset_ + bytes) {
        return absl::OkStatus();
      }
      return absl::InvalidArgumentError(absl::StrCat("shared: grad_input at bytes [",
                                                     grad_input_offset_, ", +", bytes,
                                                     ") overlaps ", what, " at [", offset,
                                                     ", +", length, ")"));
    };
    FLCE_RETURN_IF_ERROR(apart("hidden", hidden_offset_, bytes));
    if (shared.has_targets_offset()) {
      FLCE_RETURN_IF_ERROR(
          apart("the targets", shared.targets_offset(), spec_.num_tokens * int64_t{4}));
    }
    if (region_->device() != nullptr) {
      spec_.grad_input_peer = region_->device();
      spec_.grad_input_peer_offset = grad_input_offset_;
    }
  }
  return absl::OkStatus();
}

absl::Status ComputeJob::AddRowsFromDevice() {
  hidden_on_device_ = true;
  // Pieces of 32 MiB: each is copied and checked on the GPU while the
  // previous ones compute.
  const int64_t rows_per_piece = std::max<int64_t>(1, (int64_t{32} << 20) / row_bytes_);
  const int64_t hidden_size = head_.head->spec().hidden_size;
  for (int64_t t = 0; t < spec_.num_tokens; t += rows_per_piece) {
    const int64_t rows = std::min(rows_per_piece, spec_.num_tokens - t);
    FLCE_RETURN_IF_ERROR(rows_->Accept(t, rows * row_bytes_, row_bytes_).status());
    FLCE_ASSIGN_OR_RETURN(PeerRows got, call_->AddHiddenFromPeer(t, rows, *region_->device(),
                                                                hidden_offset_ + t * row_bytes_));
    if (got.first_non_finite >= 0) {
      return NonFiniteRowError("hidden", t + got.first_non_finite / hidden_size,
                               got.first_non_finite % hidden_size);
    }
    hidden_fingerprint_ += got.fingerprint;
  }
  AddLocalTransportBytes("in", spec_.num_tokens * row_bytes_);
  return absl::OkStatus();
}

void ComputeJob::AddLocalTransportBytes(const char* direction, int64_t bytes) {
  if (ctx_.metrics == nullptr) return;
  if (region_->base() != nullptr) {
    ctx_.metrics->AddSharedMemoryBytes(direction, bytes);
  } else {
    ctx_.metrics->AddCudaIpcBytes(direction, bytes);
  }
}

absl::Status ComputeJob::AddRowsFromRegion() {
  // A private copy of each piece: the client may write (or shrink) the region
  // at any time, and the checks, the fingerprint and the engine must all see
  // the same bytes.
  const int64_t rows_per_piece = std::max<int64_t>(1, (int64_t{8} << 20) / row_bytes_);
  std::string piece;
  for (int64_t t = 0; t < spec_.num_tokens; t += rows_per_piece) {
    const int64_t rows = std::min(rows_per_piece, spec_.num_tokens - t);
    piece.resize(static_cast<size_t>(rows * row_bytes_));
    FLCE_RETURN_IF_ERROR(
        GuardedCopy(piece.data(), region_->base() + hidden_offset_ + t * row_bytes_, piece.size()));
    FLCE_RETURN_IF_ERROR(AddRows(t, piece));
  }
  if (ctx_.metrics != nullptr) {
    ctx_.metrics->AddSharedMemoryBytes("in", spec_.num_tokens * row_bytes_);
  }
  return absl::OkStatus();
}

void ComputeJob::SendGradInput(int64_t token_offset, int64_t rows, std::string data) {
  if (region_ != nullptr) {
    absl::Status copied = GuardedCopy(
        region_->base() + grad_input_offset_ + token_offset * row_bytes_, data.data(), data.size());
    if (ctx_.metrics != nullptr) {
      ctx_.metrics->AddSharedMemoryBytes("out", static_cast<int64_t>(data.size()));
    }
    absl::MutexLock lock(&region_write_mu_);
    if (region_write_status_.ok()) region_write_status_ = copied;
    return;
  }
  if (!data_plane_token_.empty()) {
    SendGradInputOnDataPlane(token_offset, data);
    return;
  }
  if (ctx_.metrics != nullptr) {
    ctx_.metrics->AddSentBytes("Compute", static_cast<int64_t>(data.size()));
  }
  int64_t per_message = ItemsPerMessage(ctx_.config.max_response_bytes, row_bytes_);
  for (int64_t done = 0; done < rows; done += per_message) {
    int64_t n = std::min(per_message, rows - done);
    auto response = std::make_unique<v1::ComputeResponse>();
    v1::GradInputChunk* out = response->mutable_grad_input();
    out->set_token_offset(token_offset + done);
    out->set_num_tokens(n);
    if (n == rows) {
      out->set_data(std::move(data));
    } else {
      out->set_data(data.substr(done * row_bytes_, n * row_bytes_));
    }
    channel_->Send(std::move(response));
  }
}

void ComputeJob::SendGradInputOnDataPlane(int64_t token_offset, const std::string& data) {
  // Called from the sender's one thread only.
  absl::Status written;
  if (data_plane_ == nullptr) data_plane_ = ctx_.pieces->DataPlaneWriter(data_plane_token_);
  if (data_plane_ == nullptr) {
    written = absl::InternalError(
        "data plane: grad_input is ready but no data-plane connection holds the call");
  } else {
    written = data_plane_->Write(token_offset, data);
  }
  if (written.ok() && ctx_.metrics != nullptr) {
    ctx_.metrics->AddDataPlaneBytes("out", static_cast<int64_t>(data.size()));
  }
  absl::MutexLock lock(&region_write_mu_);
  if (data_plane_status_.ok()) data_plane_status_ = written;
}

absl::Status ComputeJob::GradInputStatus() {
  return grad_input_ == nullptr ? absl::OkStatus() : grad_input_->status();
}

void ComputeJob::SendTokenOutputs(const ComputeResult& result) {
  const OutputSelection& want = spec_.outputs;
  if (!want.per_token_loss && !want.logprob && !want.entropy && !want.accuracy) return;
  // loss, logprob, entropy: 4 bytes each; correct: 1.
  int64_t per_message = ItemsPerMessage(ctx_.config.max_response_bytes, 13);
  auto slice = [](const auto& values, int64_t begin, int64_t n) {
    using T = typename std::decay_t<decltype(values)>::value_type;
    if (static_cast<int64_t>(values.size()) < begin + n) return std::string();
    return std::string(reinterpret_cast<const char*>(values.data() + begin), n * sizeof(T));
  };
  for (int64_t begin = 0; begin < spec_.num_tokens; begin += per_message) {
    int64_t n = std::min(per_message, spec_.num_tokens - begin);
    auto response = std::make_unique<v1::ComputeResponse>();
    v1::TokenOutputsChunk* out = response->mutable_token_outputs();
    out->set_token_offset(begin);
    out->set_num_tokens(n);
    if (want.per_token_loss) out->set_loss(slice(result.per_token_loss, begin, n));
    if (want.logprob) out->set_logprob(slice(result.logprob, begin, n));
    if (want.entropy) out->set_entropy(slice(result.entropy, begin, n));
    if (want.accuracy) out->set_correct(slice(result.correct, begin, n));
    if (ctx_.metrics != nullptr) {
      ctx_.metrics->AddSentBytes(
          "Compute", static_cast<int64_t>(out->loss().size() + out->logprob().size() +
                                          out->entropy().size() + out->correct().size()));
    }
    channel_->Send(std::move(response));
  }
}

absl::Status ComputeJob::ExpectHalfClose() {
  FLCE_ASSIGN_OR_RETURN(std::optional<v1::ComputeRequest> next, channel_->Next());
  if (!next.has_value()) return absl::OkStatus();
  return MessageAfterEndError("ComputeRequest.end", Describe(*next));
}

absl::Status ComputeJob::Complete(const v1::EndOfInput& end) {
  if (end.num_tokens() != spec_.num_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("end.num_tokens = ", end.num_tokens(),
                                                   " but the header's num_tokens is ",
                                                   spec_.num_tokens));
  }
  FLCE_RETURN_IF_ERROR(rows_->CheckComplete());
  scope_->mark_phase("input");
  FLCE_ASSIGN_OR_RETURN(ComputeResult result, call_->Finish());
  call_.reset();
  scope_->mark_phase("finish");
  head_use_.Release();  // the weight is no longer read: a step may go ahead
  if (grad_input_ != nullptr) FLCE_RETURN_IF_ERROR(grad_input_->Drain());
  {
    absl::MutexLock lock(&region_write_mu_);
    FLCE_RETURN_IF_ERROR(region_write_status_);
    FLCE_RETURN_IF_ERROR(data_plane_status_);
  }
  if (result.grad_input_first_non_finite >= 0) {
    const int64_t h = head_.head->spec().hidden_size;
    return NonFiniteGradInputError(result.grad_input_first_non_finite / h,
                                   result.grad_input_first_non_finite % h);
  }
  if (spec_.grad_input_peer != nullptr) AddLocalTransportBytes("out", spec_.num_tokens * row_bytes_);
  FLCE_RETURN_IF_ERROR(CheckOutputsFinite(result));
  if (begin_.replay && begin_.first.hidden_on_device != hidden_on_device_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "request id \"", request_id_, "\" was first sent with hidden ",
        begin_.first.hidden_on_device ? "that the GPU read from a region (cuda_ipc, or shm on a GPU)"
                                      : "that the host read (messages, or shm on the CPU)",
        "; its retry must send hidden the same way (the two are fingerprinted differently) or "
        "use a new request id"));
  }
  if (begin_.replay && begin_.first.hidden_fingerprint != hidden_fingerprint_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "request id \"", request_id_,
        "\" was used for a call with other hidden states in this session: choose a new request "
        "id for new data (found once every row had arrived; the grad_input sent is not valid)"));
  }
  // Everything but the summary goes out first; the contribution lands only
  // once it has and the client is still there, and the summary is the very
  // last step. A client that fails before the commit leaves nothing behind
  // (no staged contribution holding a --max-pending slot); one that loses
  // only the summary retries with the same request id (docs/API.md).
  SendTokenOutputs(result);
  FLCE_RETURN_IF_ERROR(channel_->WaitForSent());
  FLCE_RETURN_IF_ERROR(ExpectHalfClose());
  if (slot_held_) {
    // CompleteContribution releases the slot whatever it returns.
    slot_held_ = false;
    FLCE_RETURN_IF_ERROR(
        ctx_.sessions->CompleteContribution(*session_, request_id_, std::move(staging_), deferred_,
                                            spec_.num_tokens, hidden_fingerprint_,
                                            hidden_on_device_));
  }
  scope_->mark_phase("land");
  scope_->set_strategy(result.strategy_used);
  scope_->set_kernels(result.kernels);
  scope_->set_input_wait_ms(result.input_wait_ms);
  if (ctx_.metrics != nullptr) {
    ctx_.metrics->RecordCompute(head_.owner, head_.head_id, result.strategy_used, spec_.num_tokens,
                                result.engine_ms / 1000.0);
  }

  auto response = std::make_unique<v1::ComputeResponse>();
  v1::ComputeSummary* summary = response->mutable_summary();
  summary->set_loss(result.loss);
  summary->set_n_valid(result.n_valid);
  summary->set_z_loss(result.z_loss);
  summary->set_n_correct(result.n_correct);
  if (spec_.outputs.accuracy && result.n_valid > 0) {
    summary->set_accuracy(static_cast<double>(result.n_correct) /
                          static_cast<double>(result.n_valid));
  }
  summary->set_entropy_sum(result.entropy_sum);
  if (spec_.policy.has_value()) {
    PolicySummaryToProto(spec_.policy->loss, result.policy, summary->mutable_policy());
  }
  if (spec_.preference.has_value()) {
    PreferenceSummaryToProto(spec_.preference->loss, result.preference,
                             summary->mutable_preference());
    summary->mutable_preference()->set_first_pass_ms(result.preference_first_pass_ms);
  }
  summary->set_strategy_used(result.strategy_used);
  summary->set_kernels(result.kernels);
  summary->set_engine(ctx_.engine->info().name);
  summary->set_head_version(head_.version);
  summary->set_server_instance_id(ctx_.instance_id);
  if (!forward_only_) {
    if (begin_.replay) {
      summary->set_replayed(true);
      summary->set_staged(begin_.first.state == ContributionState::kStaged);
      summary->set_committed(begin_.first.state == ContributionState::kCommitted);
    } else {
      summary->set_staged(deferred_);
      summary->set_committed(!deferred_);
    }
  }
  v1::Timings* timings = summary->mutable_timings();
  timings->set_engine_ms(result.engine_ms);
  timings->set_wait_ms(result.wait_ms + staging_wait_ms_ + gate_wait_ms_);
  timings->set_total_ms(absl::ToDoubleMilliseconds(absl::Now() - start_));
  channel_->Send(std::move(response));
  return absl::OkStatus();
}

}  // namespace flce::server
