// flce::Client: the C++ client of the flce.v1.Flce service. It hides the
// chunked streaming of the protocol (head uploads, hidden states in,
// grad_input and grad_W out) behind calls that take and return whole byte
// buffers, and turns every grpc::Status into an absl::Status with the same
// code and message.
//
// Usage:
//   ClientOptions options;  options.target = "127.0.0.1:50051";
//   FLCE_ASSIGN_OR_RETURN(std::unique_ptr<Client> client, Client::Connect(options));
//   FLCE_ASSIGN_OR_RETURN(v1::HeadInfo head, client->UploadHead(upload));
//   ComputeArgs args;
//   args.header.set_head_id("h1");  args.header.set_session_id("s1");
//   args.header.set_hidden_dtype(v1::DTYPE_BF16);
//   args.targets = ...;  args.hidden = hidden_bytes;     // BT x H bf16
//   FLCE_ASSIGN_OR_RETURN(ComputeOutcome out, client->Compute(args));
//   // out.summary.loss(), out.grad_input (BT x H bf16)
//   FLCE_ASSIGN_OR_RETURN(FetchedGrad grad, client->FetchGrad({"h1", "s1"}));
//
// A Client is safe to use from several threads at once: each call has its
// own grpc::ClientContext, and the channel is shared.
#ifndef FLCE_CLIENT_CPP_CLIENT_H_
#define FLCE_CLIENT_CPP_CLIENT_H_

#include <grpcpp/channel.h>
#include <grpcpp/security/credentials.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "client/cpp/client_options.h"
#include "client/cpp/data_plane_link.h"
#include "client/cpp/health_check.h"
#include "client/cpp/recent_transports.h"
#include "client/cpp/shared_memory_transport.h"
#include "flce/v1/flce.grpc.pb.h"
#include "flce/v1/flce.pb.h"

namespace flce {

// Called after each chunk goes out: bytes sent so far of bytes in total.
using ProgressCallback = std::function<void(int64_t done, int64_t total)>;

struct HeadUpload {
  std::string head_id;
  int64_t vocab_size = 0;            // V
  int64_t hidden_size = 0;           // H
  v1::DType dtype = v1::DTYPE_BF16;  // of the bytes below and of the resident head
  absl::string_view weight;          // V x H, row-major, little-endian
  absl::string_view bias;            // V elements; empty = no bias
};

struct ComputeArgs {
  // Everything the caller chooses: head_id, session_id, hidden_dtype,
  // reduction, options, outputs, commit, ... The client fills num_tokens and
  // targets from below, and request_id with a fresh one when it is empty.
  v1::ComputeHeader header;
  std::vector<int32_t> targets;  // BT
  absl::string_view hidden;      // BT x H in header.hidden_dtype
  int64_t chunk_bytes = 0;       // hidden bytes per message; 0 = options' chunk_bytes
  ProgressCallback progress;     // hidden bytes sent; called on the sending thread
  // Optional: a string whose storage the outcome's grad_input takes over
  // (moved from; its contents do not matter). Passing the previous step's
  // grad_input spares a step the page faults and zeroing of a fresh
  // BT x H buffer.
  std::string* grad_input_storage = nullptr;
};

struct ComputeOutcome {
  std::string request_id;  // as sent (the caller's or a generated one)
  std::string transport;   // how hidden went: "shm", "data_plane" or "grpc" (messages)
  int connections = 1;     // messages: the call's own stream and its ComputePiece streams
  // The targets went in the shared-memory region beside hidden rather than in
  // the header (servers with capability "targets_in_region", 0.7.0).
  bool targets_in_region = false;
  v1::ComputeSummary summary;
  std::string grad_input;  // BT x H in hidden_dtype; empty when not asked for
  // BT each, when asked for in header.outputs and sent by the server.
  std::vector<float> per_token_loss;
  std::vector<float> logprob;
  std::vector<float> entropy;
  std::vector<uint8_t> correct;
};

struct FetchGradArgs {
  std::string head_id;
  std::string session_id;
  v1::DType dtype = v1::DTYPE_FP32;  // FP32 or BF16
  bool reset = false;                // zero the accumulator in the same step
  std::string request_id;            // with reset: generated when empty
  int64_t chunk_rows = 0;            // 0 = the server's choice
};

struct FetchedGrad {
  std::string request_id;  // as sent; empty without reset unless given
  v1::GradHeader header;
  std::string weight;  // V x H in header.dtype
  std::string bias;    // V in header.dtype; empty without a bias
};

struct DownloadedHead {
  v1::DownloadHeader header;  // the head, and the dtype of the bytes below
  std::string weight;         // V x H
  std::string bias;           // V; empty without a bias
};

struct EmbedArgs {
  std::string head_id;
  std::vector<int32_t> token_ids;                 // each in [0, V)
  v1::DType dtype = v1::DTYPE_UNSPECIFIED;        // the head's dtype, or FP32
  std::optional<uint64_t> expected_head_version;  // FAILED_PRECONDITION when it moved on
  int64_t chunk_rows = 0;                         // rows per message; 0 = the server's choice
};

struct EmbeddedRows {
  v1::EmbedHeader header;  // H, dtype, the head version every row is of
  std::string rows;        // token_ids.size() x H in header.dtype
};

struct EmbedGradArgs {
  // head_id, session_id, dtype, padding_idx, deterministic, expected_head_version:
  // the caller's; the client fills num_tokens and token_ids from below, and
  // request_id with a fresh one when it is empty.
  v1::EmbedGradHeader header;
  std::vector<int32_t> token_ids;
  absl::string_view rows;   // token_ids.size() x H in header.dtype
  int64_t chunk_bytes = 0;  // row bytes per message; 0 = options' chunk_bytes
};

class Client {
 public:
  // Creates the channel (no connection is made until the first call).
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const ClientOptions& options);
  // Over an existing channel, e.g. an in-process one in tests.
  Client(std::shared_ptr<grpc::Channel> channel, ClientOptions options);

  const ClientOptions& options() const { return options_; }
  // Where the calls that carry tensors in messages go: options().target, or
  // "unix:" + the server's socket once they moved there (options().unix_socket).
  std::string messages_target();

  // Heads.
  absl::StatusOr<v1::HeadInfo> UploadHead(const HeadUpload& upload,
                                          const ProgressCallback& progress = {});
  absl::StatusOr<v1::HeadInfo> LoadHeadFromFile(const v1::LoadHeadFromFileRequest& request);
  absl::StatusOr<v1::HeadInfo> DescribeHead(const std::string& head_id);
  absl::StatusOr<std::vector<v1::HeadInfo>> ListHeads();
  absl::StatusOr<v1::UnloadHeadResponse> UnloadHead(const std::string& head_id);

  // The fused linear + cross-entropy of one request.
  absl::StatusOr<ComputeOutcome> Compute(const ComputeArgs& args);

  // Gradients and sessions.
  absl::StatusOr<v1::CommitResponse> Commit(const v1::CommitRequest& request);
  absl::StatusOr<FetchedGrad> FetchGrad(const FetchGradArgs& args);
  absl::Status ZeroGrad(const std::string& head_id, const std::string& session_id);
  // head_id "" = every head's sessions.
  absl::StatusOr<std::vector<v1::SessionInfo>> ListSessions(const std::string& head_id = "");
  absl::Status DeleteSession(const std::string& head_id, const std::string& session_id);

  // Training the head on the server: no weight or gradient crosses the wire.
  absl::StatusOr<v1::OptimizerInfo> CreateOptimizer(const v1::CreateOptimizerRequest& request);
  absl::StatusOr<v1::GradNormResponse> GradNorm(const std::string& head_id,
                                                const std::string& session_id);
  // An empty request_id is filled with a new one (NewRequestId).
  absl::StatusOr<v1::StepResponse> Step(v1::StepRequest request);
  // The head's weight (master: a 16-bit head's fp32 master) and bias.
  absl::StatusOr<DownloadedHead> DownloadHead(const std::string& head_id, bool master = false,
                                              int64_t chunk_rows = 0);
  // A tied input embedding: the lookup, and its gradient added into the
  // session's grad_W (where the head's own accumulates) before one Step.
  absl::StatusOr<EmbeddedRows> Embed(const EmbedArgs& args);
  absl::StatusOr<v1::EmbedGradSummary> EmbedGrad(const EmbedGradArgs& args);
  // Checkpoints of the head and its optimizer state, on the server (--checkpoint-dir);
  // an empty request_id is filled with a new one.
  absl::StatusOr<v1::CheckpointInfo> SaveCheckpoint(v1::SaveCheckpointRequest request);
  absl::StatusOr<v1::HeadInfo> LoadCheckpoint(v1::LoadCheckpointRequest request);

  absl::StatusOr<v1::ServerInfo> GetServerInfo();
  // grpc.health.v1; service "" = the whole server.
  absl::StatusOr<HealthStatus> Health(const std::string& service = "");

 private:
  // Sets the call's deadline from options_.timeout (and the bearer token).
  void Prepare(grpc::ClientContext& context) const;
  // The bearer token only: for the Regions stream, which lives as long as
  // the client.
  void Authorize(grpc::ClientContext& context) const;
  // The stub of the calls that carry tensors: the first time, moved to the
  // server's Unix-domain socket where options_.unix_socket allows it.
  v1::Flce::Stub& BulkStub();
  // GetServerInfo, asked until it answers once (the message limit and the
  // local transports come from that answer).
  absl::StatusOr<v1::ServerInfo> ServerInfoOnce();
  // The shared-memory transport when Compute uses it (options_.transport; the
  // server asked once), nullptr for messages; FAILED_PRECONDITION with kShm
  // where it is not offered.
  absl::StatusOr<std::shared_ptr<SharedMemoryTransport>> SharedTransport();
  // After a region the server would not take (kAuto): messages from now on.
  void DropSharedTransport(const absl::Status& why);
  // Why a call sends hidden in messages, for the server's metrics.
  v1::MessagesReason WhyMessages();
  // How many streams carry a call's `chunks` row chunks in messages (the
  // call's own and its pieces): options_.connections where the server takes
  // pieces, each at least one chunk; their stubs made once.
  int HiddenStreams(int64_t chunks);
  std::vector<v1::Flce::Stub*> PieceStubs(int pieces);
  // Where the next call's data plane is, where this client uses it
  // (options_.data_plane; its port checked once by connecting), else nullopt;
  // FAILED_PRECONDITION or UNAVAILABLE with kOn where it cannot.
  absl::StatusOr<std::optional<DataPlaneAddress>> DataPlaneFor();
  // The payload bytes one message may carry: chunk_bytes (or `requested`),
  // capped to MessageLimit() less room for the message's other fields.
  int64_t ChunkBytes(int64_t requested);
  // min(options' max_message_bytes, the server's), the server's fetched once
  // (GetServerInfo) on first use.
  int64_t MessageLimit();

  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Flce::Stub> stub_;
  ClientOptions options_;
  std::mutex limit_mu_;
  int64_t message_limit_ = 0;  // 0 = not asked yet
  bool made_channel_ = false;  // by Connect: its arguments can be made again
  std::shared_ptr<grpc::ChannelCredentials> credentials_;  // Connect's, for the pieces' channels
  std::mutex bulk_mu_;
  bool bulk_settled_ = false;                   // guarded by bulk_mu_
  std::shared_ptr<grpc::Channel> unix_channel_;  // guarded by bulk_mu_
  std::unique_ptr<v1::Flce::Stub> unix_stub_;    // guarded by bulk_mu_
  std::string messages_target_;                 // guarded by bulk_mu_
  // What the server offers through its Unix socket once the calls moved there
  // (it offers regions to a caller running as its user there, by default).
  std::vector<std::string> unix_local_transports_;  // guarded by bulk_mu_
  std::mutex info_mu_;
  std::optional<v1::ServerInfo> server_info_;  // guarded by info_mu_
  std::mutex local_mu_;
  bool local_asked_ = false;   // guarded by local_mu_
  std::string local_refusal_;  // guarded by local_mu_: why shm is out of reach
  RecentTransports recent_transports_;  // how recent failed calls sent hidden
  std::mutex pieces_mu_;
  // ComputePiece stubs, each on a connection of its own; guarded by pieces_mu_
  std::vector<std::unique_ptr<v1::Flce::Stub>> piece_stubs_;
  // guarded by local_mu_: the same as the header's messages_reason
  v1::MessagesReason messages_reason_ = v1::MESSAGES_REASON_UNSPECIFIED;
  std::shared_ptr<SharedMemoryTransport> shm_;  // guarded by local_mu_
  std::string data_plane_off_;  // guarded by local_mu_: why kAuto stopped trying it
  bool data_plane_reached_ = false;  // guarded by local_mu_: its port accepted a connection
};

}  // namespace flce

#endif  // FLCE_CLIENT_CPP_CLIENT_H_
