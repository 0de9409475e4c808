// What every RPC handler of the server shares: configuration, the engine, the
// head registry, the session store, metrics, authentication and worker
// threads. Owned by FlceServer, which outlives every call (it drains them
// before it goes).
#ifndef FLCE_SERVER_HANDLERS_SERVICE_CONTEXT_H_
#define FLCE_SERVER_HANDLERS_SERVICE_CONTEXT_H_

#include <atomic>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpcpp/server_context.h"
#include "grpcpp/support/status.h"
#include "kernels/engine.h"
#include "server/base/server_config.h"
#include "server/base/worker_pool.h"
#include "server/observe/metrics.h"
#include "server/state/auth.h"
#include "server/state/head_registry.h"
#include "server/state/session_store.h"
#include "server/state/compute_pieces.h"
#include "server/state/local_peers.h"
#include "server/state/shared_regions.h"
#include "server/state/staging_budget.h"
#include "server/state/upload_budget.h"

namespace flce::server {

class CheckpointLog;

struct ServiceContext {
  ServerConfig config;
  Engine* engine = nullptr;
  HeadRegistry* heads = nullptr;
  SessionStore* sessions = nullptr;
  StagingBudget* staging = nullptr;  // compute calls' staging buffers
  Metrics* metrics = nullptr;
  const Authenticator* auth = nullptr;
  WorkerPool* pool = nullptr;
  WorkTracker* workers = nullptr;        // compute workers that outlive their reactions
  UploadBudget* uploads = nullptr;       // --max-upload-bytes, held by head builds in progress
  CheckpointLog* checkpoints = nullptr;  // SaveCheckpoint outcomes by request id
  SharedRegions* regions = nullptr;      // null = --local-transports=none
  LocalPeers* peers = nullptr;           // who may register regions
  ComputePieces* pieces = nullptr;       // calls taking rows on other connections
  int data_plane_port = 0;               // --data-port as bound; 0 = no data plane
  std::string instance_id;
  std::string version;
  // flce.v1 calls in progress, for --max-concurrent-streams.
  mutable std::atomic<int64_t> active_calls{0};
};

// One RPC from its start to its status: counted in the metrics (in flight
// until Done(), then its code and duration), in ctx.active_calls, and logged
// as one structured line at Done() with what the handler set. Setters are
// called from the thread that will call Done() (or before it hands over).
class RpcScope {
 public:
  RpcScope(const ServiceContext& ctx, const char* rpc);
  ~RpcScope();  // an RPC never Done() is counted as CANCELLED
  RpcScope(const RpcScope&) = delete;
  RpcScope& operator=(const RpcScope&) = delete;

  void Done(const grpc::Status& status);
  absl::Time start() const { return start_; }

  void set_request_id(absl::string_view id) { request_id_ = std::string(id); }
  void set_tenant(absl::string_view tenant) { tenant_ = std::string(tenant); }
  void set_head(absl::string_view head) { head_ = std::string(head); }
  void set_session(absl::string_view session) { session_ = std::string(session); }
  void set_tokens(int64_t tokens) { tokens_ = tokens; }
  void set_strategy(absl::string_view strategy) { strategy_ = std::string(strategy); }
  void set_kernels(absl::string_view kernels) { kernels_ = std::string(kernels); }
  void set_transport(absl::string_view transport) { transport_ = std::string(transport); }
  // The caller's gRPC peer string (set by Admit).
  void set_peer(absl::string_view peer) { peer_ = std::string(peer); }
  const std::string& peer() const { return peer_; }
  // Time since start() or since the previous mark, logged as "<name>_ms".
  void mark_phase(const char* name);
  // A Compute's ComputeResult::input_wait_ms (negative: not reported).
  void set_input_wait_ms(double ms) { input_wait_ms_ = ms; }

 private:
  const ServiceContext& ctx_;
  const char* rpc_;
  absl::Time start_;
  uint64_t call_number_;
  bool done_ = false;
  std::string request_id_;
  std::string tenant_;
  std::string head_;
  std::string session_;
  int64_t tokens_ = -1;
  std::string strategy_;
  std::string kernels_;
  std::string transport_;
  std::string peer_;
  absl::Time phase_start_;
  std::vector<std::pair<std::string, double>> phases_ms_;
  double input_wait_ms_ = -1.0;
};

// The gate every flce.v1 handler passes first: the caller's principal from
// its bearer token (UNAUTHENTICATED without a valid one when auth is on),
// then the concurrent-call limit (RESOURCE_EXHAUSTED naming
// --max-concurrent-streams). The scope must already count this call.
absl::StatusOr<Principal> Admit(const ServiceContext& ctx, const grpc::CallbackServerContext& call,
                                RpcScope& scope);

// An engine error after which the engine reports itself unhealthy becomes
// UNAVAILABLE: the device is gone, the call can be retried elsewhere.
absl::Status EngineStatus(const Engine& engine, absl::Status status);

}  // namespace flce::server

#endif  // FLCE_SERVER_HANDLERS_SERVICE_CONTEXT_H_
