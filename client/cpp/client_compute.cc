// Compute: a bidirectional stream. A writer thread sends the header and the
// hidden chunks while this thread reads grad_input and per-token chunks as
// the server produces them: the server may answer before it has all hidden
// rows, so writing everything first could stall on flow control. Through
// shared memory (SharedMemoryTransport) hidden, grad_input and the targets
// stay in a region and the stream carries only the header, the end and the
// outputs.
#include <grpcpp/client_context.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <optional>
#include <thread>
#include <tuple>
#include <utility>

#include "absl/algorithm/container.h"
#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "client/cpp/client.h"
#include "client/cpp/grpc_status.h"
#include "client/cpp/hidden_pieces.h"
#include "client/cpp/request_id.h"
#include "client/cpp/row_assembler.h"
#include "client/cpp/wire_dtype.h"
#include "core/status_macros.h"

namespace flce {

absl::StatusOr<ComputeOutcome> Client::Compute(const ComputeArgs& args) {
  const int64_t tokens = static_cast<int64_t>(args.targets.size());
  const int64_t elem = WireDTypeSize(args.header.hidden_dtype());
  if (elem == 0) return absl::InvalidArgumentError("hidden_dtype is unspecified");
  if (tokens == 0) return absl::InvalidArgumentError("no tokens: targets is empty");
  const int64_t hidden_bytes = static_cast<int64_t>(args.hidden.size());
  if (hidden_bytes == 0 || hidden_bytes % (tokens * elem) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("hidden is ", hidden_bytes, " bytes, not a whole number of ", tokens,
                     " rows of ", WireDTypeName(args.header.hidden_dtype())));
  }
  const int64_t row_bytes = hidden_bytes / tokens;
  const int64_t chunk = ChunkBytes(args.chunk_bytes);
  if (row_bytes > chunk) {
    return absl::InvalidArgumentError(
        absl::StrCat("one hidden row is ", row_bytes, " bytes, more than a chunk (", chunk, ")"));
  }
  int64_t rows_per_chunk = chunk / row_bytes;
  // A server that predates an objective would ignore the field and compute
  // the cross-entropy: refused here unless it names the objective's kind.
  for (const auto& [set, capability, what] :
       {std::tuple{args.header.policy().loss() != v1::POLICY_LOSS_NONE, "policy_objectives",
                   "policy objectives"},
        std::tuple{args.header.preference().loss() != v1::PREFERENCE_LOSS_NONE,
                   "preference_objectives", "preference objectives"}}) {
    if (!set) continue;
    FLCE_ASSIGN_OR_RETURN(v1::ServerInfo info, ServerInfoOnce());
    if (!absl::c_linear_search(info.capabilities(), capability)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the server (", info.version(), ", engine ", info.engine(), ") does not compute ",
          what, ": its capabilities do not name \"", capability, "\""));
    }
  }

  ComputeOutcome outcome;
  v1::ComputeRequest first;
  v1::ComputeHeader* header = first.mutable_header();
  *header = args.header;
  if (header->request_id().empty()) header->set_request_id(NewRequestId());
  outcome.request_id = header->request_id();
  header->set_num_tokens(tokens);
  // Lets the server name a width mismatch instead of counting missing rows.
  header->set_hidden_size(row_bytes / elem);
  // The wire's int32 bytes are little-endian, as is every host flce runs on.
  header->set_targets(reinterpret_cast<const char*>(args.targets.data()), tokens * 4);

  const v1::OutputSelection& wanted = header->outputs();
  const bool want_grad_input =
      wanted.has_grad_input() ? wanted.grad_input() : !wanted.forward_only();
  if (want_grad_input) {
    if (args.grad_input_storage != nullptr) {
      outcome.grad_input = std::move(*args.grad_input_storage);
      args.grad_input_storage->clear();
    }
    outcome.grad_input.resize(hidden_bytes);
  }
  if (wanted.per_token_loss()) outcome.per_token_loss.resize(tokens);
  if (wanted.logprob()) outcome.logprob.resize(tokens);
  if (wanted.entropy()) outcome.entropy.resize(tokens);
  if (wanted.accuracy()) outcome.correct.resize(tokens);
  RowAssembler grad_input("grad_input", tokens, row_bytes, outcome.grad_input.data());
  RowAssembler loss("per-token loss", tokens, 4, outcome.per_token_loss.data());
  RowAssembler logprob("logprob", tokens, 4, outcome.logprob.data());
  RowAssembler entropy("entropy", tokens, 4, outcome.entropy.data());
  RowAssembler correct("correct", tokens, 1, outcome.correct.data());

  // Shared memory where the server offers it: hidden written into a region,
  // grad_input read from it after the call; the messages are header and end.
  // A retry goes the way its request id first went.
  const std::string first_way = recent_transports_.Get(outcome.request_id);
  absl::StatusOr<std::shared_ptr<SharedMemoryTransport>> shm =
      first_way == "grpc" ? nullptr : SharedTransport();
  if (!shm.ok()) return shm.status();
  std::shared_ptr<SharedRegion> region;
  // hidden, then grad_input, then (where the server reads them there) the
  // targets at a 16-byte boundary: the header then carries no per-token data.
  const int64_t rows_bytes = want_grad_input ? 2 * hidden_bytes : hidden_bytes;
  const int64_t targets_at = (rows_bytes + 15) / 16 * 16;
  bool targets_in_region = false;
  if (*shm != nullptr) {
    absl::StatusOr<v1::ServerInfo> info = ServerInfoOnce();
    targets_in_region = info.ok() && absl::c_linear_search(info->capabilities(),
                                                           "targets_in_region");
    absl::StatusOr<std::shared_ptr<SharedRegion>> got =
        (*shm)->Acquire(targets_in_region ? targets_at + tokens * 4 : rows_bytes);
    if (got.ok()) {
      region = *std::move(got);
    } else if (options_.transport == ClientOptions::Transport::kShm) {
      return got.status();
    } else {
      DropSharedTransport(got.status());  // e.g. a server that may not open our objects
    }
  }
  // Back to the free regions however the call ends.
  std::unique_ptr<void, std::function<void(void*)>> give_back(
      region.get(), [&](void*) { (*shm)->GiveBack(region); });
  outcome.transport = region != nullptr ? "shm" : "grpc";
  if (first_way == "shm" && region == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "request_id ", outcome.request_id,
        " was first sent through shm, which this client cannot use for it now: a retry goes "
        "the way its request id first went (the server tells the two apart)"));
  }
  // However the call fails from here on, its retry must take the same way.
  bool succeeded = false;
  absl::Cleanup remember_way = [this, &succeeded, id = outcome.request_id,
                                way = outcome.transport] {
    if (!succeeded) recent_transports_.Remember(id, way);
  };
  if (region != nullptr) {
    std::memcpy(region->data(), args.hidden.data(), hidden_bytes);
    v1::SharedHidden* shared = header->mutable_shared();
    shared->set_region_id(region->region_id());
    shared->set_hidden_offset(0);
    shared->set_grad_input_offset(hidden_bytes);
    if (targets_in_region) {
      std::memcpy(region->data() + targets_at, args.targets.data(), tokens * 4);
      header->clear_targets();
      shared->set_targets_offset(targets_at);
      outcome.targets_in_region = true;
    }
  }

  // In messages (saying why), over several connections where the server
  // takes pieces.
  std::optional<HiddenPieces> pieces;
  // The data plane: rows and grad_input beside the stream, on a connection
  // made when the token arrives.
  std::optional<DataPlaneAddress> data_plane;
  std::unique_ptr<DataPlaneLink> link;
  if (region == nullptr) {
    header->set_messages_reason(WhyMessages());
    FLCE_ASSIGN_OR_RETURN(data_plane, DataPlaneFor());
  }
  if (data_plane.has_value()) {
    header->set_data_plane(true);
    outcome.transport = "data_plane";
  } else if (region == nullptr) {
    const int streams = HiddenStreams((tokens + rows_per_chunk - 1) / rows_per_chunk);
    if (streams > 1) {
      // A chunk's worth in flight on all the streams together: the first rows
      // arrive as early as on one stream.
      rows_per_chunk = std::max<int64_t>(1, rows_per_chunk / streams);
      header->set_hidden_pieces(streams - 1);
      outcome.connections = streams;
      pieces.emplace(PieceStubs(streams - 1),
                     [this](grpc::ClientContext& piece) { Prepare(piece); }, args.hidden,
                     row_bytes, rows_per_chunk);
    }
  }

  grpc::ClientContext context;
  Prepare(context);
  std::unique_ptr<grpc::ClientReaderWriter<v1::ComputeRequest, v1::ComputeResponse>> stream =
      BulkStub().Compute(&context);

  std::thread writer([&] {
    if (!stream->Write(first)) return;  // the server ended the call; Finish says why
    if (region == nullptr && !data_plane.has_value()) {
      // One message reused for every chunk: its data string keeps its
      // capacity, so each chunk is one copy into memory already mapped rather
      // than a fresh multi-MiB allocation (page faults and zeroing) per message.
      v1::ComputeRequest message;
      v1::HiddenChunk* piece = message.mutable_hidden();
      for (int64_t row = 0, chunk = 0; row < tokens; row += rows_per_chunk, ++chunk) {
        if (pieces.has_value() && !pieces->OwnChunk(chunk)) continue;  // a piece's
        const int64_t rows = std::min(rows_per_chunk, tokens - row);
        piece->set_token_offset(row);
        piece->mutable_data()->assign(args.hidden.data() + row * row_bytes, rows * row_bytes);
        if (!stream->Write(message)) return;
        if (args.progress) args.progress((row + rows) * row_bytes, hidden_bytes);
      }
    } else if (args.progress) {
      args.progress(hidden_bytes, hidden_bytes);
    }
    // Only this says "done": the server lands nothing from a stream that just
    // stops, as a dying or cancelled client's does. The half-close travels
    // with it: the server lands the call only once the stream has closed
    // behind its end message.
    v1::ComputeRequest end;
    end.mutable_end()->set_num_tokens(tokens);
    stream->WriteLast(end, grpc::WriteOptions());
  });

  absl::Status protocol;
  bool have_summary = false;
  v1::ComputeResponse response;
  while (protocol.ok() && stream->Read(&response)) {
    if (have_summary) {
      protocol = absl::InternalError("server sent a message after the summary");
      break;
    }
    switch (response.msg_case()) {
      case v1::ComputeResponse::kGradInput: {
        const v1::GradInputChunk& piece = response.grad_input();
        if (!want_grad_input || region != nullptr || data_plane.has_value()) {
          protocol = absl::InternalError(
              region != nullptr || data_plane.has_value()
                  ? "server sent grad_input in messages for a call whose grad_input goes to a "
                    "region or the data plane"
                  : "server sent grad_input that was not asked for");
          break;
        }
        protocol = grad_input.Place(piece.token_offset(), piece.num_tokens(), piece.data());
        break;
      }
      case v1::ComputeResponse::kTokenOutputs: {
        const v1::TokenOutputsChunk& piece = response.token_outputs();
        const int64_t at = piece.token_offset(), n = piece.num_tokens();
        if (protocol.ok() && !piece.loss().empty() && !outcome.per_token_loss.empty()) {
          protocol = loss.Place(at, n, piece.loss());
        }
        if (protocol.ok() && !piece.logprob().empty() && !outcome.logprob.empty()) {
          protocol = logprob.Place(at, n, piece.logprob());
        }
        if (protocol.ok() && !piece.entropy().empty() && !outcome.entropy.empty()) {
          protocol = entropy.Place(at, n, piece.entropy());
        }
        if (protocol.ok() && !piece.correct().empty() && !outcome.correct.empty()) {
          protocol = correct.Place(at, n, piece.correct());
        }
        break;
      }
      case v1::ComputeResponse::kSummary:
        outcome.summary = response.summary();
        have_summary = true;
        break;
      case v1::ComputeResponse::kPieces:
        if (data_plane.has_value()) {
          absl::StatusOr<std::unique_ptr<DataPlaneLink>> connected =
              link == nullptr ? DataPlaneLink::Connect(*data_plane)
                              : absl::InternalError("server opened the data plane twice");
          if (!connected.ok()) {
            protocol = connected.status();
          } else {
            link = *std::move(connected);
            link->Start(response.pieces().token(), args.hidden, row_bytes, rows_per_chunk,
                        want_grad_input ? &grad_input : nullptr);
          }
        } else if (!pieces.has_value()) {
          protocol = absl::InternalError("server opened pieces that were not asked for");
        } else {
          pieces->Start(response.pieces().token(), [&context] { context.TryCancel(); });
        }
        break;
      default:
        protocol = absl::InternalError("server sent an empty compute response");
    }
  }
  if (!protocol.ok()) {
    context.TryCancel();
    while (stream->Read(&response)) {
    }
  }
  writer.join();
  const absl::Status finished = FromGrpcStatus(stream->Finish());
  if (pieces.has_value()) {
    pieces->CallEnded();
    pieces->Join();  // each answered once the call took its rows, or has ended
  }
  // A call this client cancelled because a piece failed first fails with that.
  const absl::Status status =
      pieces.has_value() && finished.code() == absl::StatusCode::kCancelled &&
              !pieces->failure().ok()
          ? pieces->failure()
          : finished;
  if (link != nullptr) {
    if (!protocol.ok() || !status.ok()) link->Close();  // its threads stop now
    absl::Status received = link->Finish();
    if (protocol.ok() && status.ok() && !received.ok()) protocol = received;
  }
  if (!protocol.ok()) return protocol;
  if (!status.ok()) return status;
  if (!have_summary) return absl::DataLossError("the call ended without a summary");
  if (want_grad_input && region != nullptr) {
    std::memcpy(outcome.grad_input.data(), region->data() + hidden_bytes, hidden_bytes);
  } else if (want_grad_input) {
    absl::Status complete = grad_input.CheckComplete("the call");
    if (!complete.ok()) return complete;
  }
  for (const auto& [asked, part] :
       {std::pair<bool, const RowAssembler*>{wanted.per_token_loss(), &loss},
        {wanted.logprob(), &logprob},
        {wanted.entropy(), &entropy}}) {
    if (!asked) continue;
    absl::Status complete = part->CheckComplete("the call");
    if (!complete.ok()) return complete;
  }
  // Accuracy needs only the summary's counts; per-token flags are a bonus.
  if (wanted.accuracy() && !correct.any()) outcome.correct.clear();
  succeeded = true;
  return outcome;
}

}  // namespace flce
