// The whole flce server in one object: engine, heads, sessions, metrics, the
// gRPC server with health and reflection, and a housekeeping thread (session
// TTL sweeps, gauges, engine health).
//
// Usage:
//   ServerConfig config;  config.address = "127.0.0.1:0";
//   FLCE_ASSIGN_OR_RETURN(auto server, FlceServer::Create(config));
//   ... server->port() ...
//   server->Shutdown();               // drain (config.drain), then stop
//   absl::Status why = server->Wait();
#ifndef FLCE_SERVER_FLCE_SERVER_H_
#define FLCE_SERVER_FLCE_SERVER_H_

#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/grpcpp.h"
#include "kernels/engine.h"
#include "server/base/server_config.h"
#include "server/base/worker_pool.h"
#include "server/handlers/service_context.h"
#include "server/observe/metrics.h"
#include "server/rpc/flce_service.h"
#include "server/rpc/data_plane_listener.h"
#include "server/rpc/unix_socket_listener.h"
#include "server/rpc/unix_socket_path.h"
#include "server/state/auth.h"
#include "server/state/head_registry.h"
#include "server/state/session_store.h"
#include "server/state/upload_budget.h"
#include "server/storage/checkpoint_log.h"

namespace flce::server {

// The engine config.device asks for: "cpu", "cuda" (UNAVAILABLE without a
// GPU or the plugin) or "auto" (CUDA if it loads, else the CPU engine).
// With --gpus other than 1 (ParseGpus), always the CUDA engine.
absl::StatusOr<std::unique_ptr<Engine>> CreateEngine(const ServerConfig& config);

// --gpus into config.devices / config.all_devices; INVALID_ARGUMENT for
// anything but a positive count, "all" or a list of ordinals.
absl::Status ParseGpus(const std::string& gpus, EngineConfig& config);

class FlceServer {
 public:
  static absl::StatusOr<std::unique_ptr<FlceServer>> Create(const ServerConfig& config);
  // With an engine made elsewhere (tests).
  static absl::StatusOr<std::unique_ptr<FlceServer>> Create(const ServerConfig& config,
                                                            std::unique_ptr<Engine> engine);
  ~FlceServer();  // Shutdown() first
  FlceServer(const FlceServer&) = delete;
  FlceServer& operator=(const FlceServer&) = delete;

  int port() const { return port_; }
  // The data plane's port (--data-port as bound); 0 without one.
  int data_port() const { return ctx_.data_plane_port; }
  int metrics_port() const { return metrics_->port(); }
  // What /metrics serves now, whether or not it is served (tests).
  std::string metrics_text() const { return metrics_->Text(); }
  const std::string& instance_id() const { return ctx_.instance_id; }

  // Health NOT_SERVING, no new calls, calls in flight get up to config.drain
  // to finish, then the rest are cancelled. Returns when all are gone.
  // Thread-safe; later calls wait for the first.
  void Shutdown();
  // Blocks until the server stopped: OK after Shutdown(), UNAVAILABLE if it
  // stopped because the engine became unhealthy.
  absl::Status Wait();
  // Rereads --auth-token-file (SIGHUP); on error the previous tokens stay.
  absl::Status ReloadAuth();

 private:
  FlceServer() = default;
  absl::Status Start(const ServerConfig& config, std::unique_ptr<Engine> engine);
  absl::Status PreloadHead();
  void Housekeeping();
  void StopServing(absl::Duration drain);

  // Destroyed bottom-up: the gRPC server and pool before the sessions and
  // heads, all of them before the engine their buffers belong to.
  std::unique_ptr<Engine> engine_;
  HeadRegistry heads_;
  // Before the sessions: their staged contributions hold reservations in it.
  std::unique_ptr<StagingBudget> staging_;
  std::unique_ptr<SessionStore> sessions_;
  std::unique_ptr<Metrics> metrics_;
  std::unique_ptr<Authenticator> auth_;
  UploadBudget uploads_;
  CheckpointLog checkpoints_;
  std::unique_ptr<LocalPeers> peers_;
  std::unique_ptr<ComputePieces> pieces_;
  std::unique_ptr<SharedRegions> regions_;
  WorkTracker workers_;
  std::unique_ptr<WorkerPool> pool_;
  ServiceContext ctx_;
  std::unique_ptr<FlceService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::unique_ptr<UnixSocketListener> unix_listener_;  // null under TLS: gRPC listens
  std::unique_ptr<DataPlaneListener> data_listener_;   // null without --data-port
  SocketFile socket_file_;  // removed at shutdown if still this server's

  absl::Mutex shutdown_mu_;  // held for the whole shutdown
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;  // housekeeping stops
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status stop_reason_ ABSL_GUARDED_BY(mu_);
  std::thread housekeeping_;
};

}  // namespace flce::server

#endif  // FLCE_SERVER_FLCE_SERVER_H_
