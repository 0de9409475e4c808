// What every RPC handler of the server shares: configuration, the engine, the
// head registry, the session store, metrics and worker threads. Owned by
// FlceServer, which outlives every call (it drains them before it goes).
#ifndef FLCE_SERVER_SERVICE_CONTEXT_H_
#define FLCE_SERVER_SERVICE_CONTEXT_H_

#include <string>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpcpp/support/status.h"
#include "kernels/engine.h"
#include "server/head_registry.h"
#include "server/metrics.h"
#include "server/server_config.h"
#include "server/session_store.h"
#include "server/thread_pool.h"

namespace flce::server {

struct ServiceContext {
  ServerConfig config;
  Engine* engine = nullptr;
  HeadRegistry* heads = nullptr;
  SessionStore* sessions = nullptr;
  Metrics* metrics = nullptr;
  ThreadPool* pool = nullptr;
  WorkTracker* workers = nullptr;  // compute workers that outlive their reactions
  std::string instance_id;
  std::string version;
};

// Counts one RPC in the metrics: in flight from construction until Done(),
// which records its status code and duration (once).
class RpcScope {
 public:
  RpcScope(Metrics* metrics, const char* rpc);
  ~RpcScope();  // an RPC never Done() is counted as CANCELLED
  RpcScope(const RpcScope&) = delete;
  RpcScope& operator=(const RpcScope&) = delete;

  void Done(const grpc::Status& status);
  absl::Time start() const { return start_; }

 private:
  Metrics* metrics_;
  const char* rpc_;
  absl::Time start_;
  bool done_ = false;
};

// An engine error after which the engine reports itself unhealthy becomes
// UNAVAILABLE: the device is gone, the call can be retried elsewhere.
absl::Status EngineStatus(const Engine& engine, absl::Status status);

}  // namespace flce::server

#endif  // FLCE_SERVER_SERVICE_CONTEXT_H_
