// Everything flce-server can be told, as a plain struct with defaults. Only
// server/main.cc fills it from flags; tests fill it directly.
#ifndef FLCE_SERVER_BASE_SERVER_CONFIG_H_
#define FLCE_SERVER_BASE_SERVER_CONFIG_H_

#include <cstdint>
#include <string>

#include "absl/time/time.h"

namespace flce::server {

struct ServerConfig {
  // "host:port"; port 0 picks a free one (FlceServer::port() says which).
  std::string address = "0.0.0.0:50051";
  int metrics_port = 9464;  // 0 = no /metrics exposer
  // Address /metrics listens on; empty = the host part of `address`, so a
  // server told to listen on loopback does not expose /metrics beyond it.
  std::string metrics_host;
  std::string device = "auto";   // "cpu", "cuda" or "auto"
  std::string cuda_plugin_path;  // empty = the loader's search order
  int64_t workspace_bytes = int64_t{2048} << 20;  // per GPU
  // --gpus: "1", a count N (GPUs 0..N-1), "all", or a list of ordinals
  // ("0,1"; an ordinal listed twice puts two shards on one GPU). More than
  // one splits every head's vocabulary across them.
  std::string gpus = "1";
  int64_t max_message_bytes = int64_t{64} << 20;  // largest message received
  // Largest message sent: 4 MiB is what a stock gRPC client accepts by default.
  int64_t max_response_bytes = int64_t{4} << 20;
  int64_t max_request_tokens = 1048576;
  int64_t max_sessions = 1024;
  // Staged (COMMIT_DEFERRED, not yet committed) contributions per session.
  // Calls still computing are not counted: they queue for staging memory.
  int64_t max_pending = 16;
  // Bytes of fp32 staging buffers (calls computing + staged contributions),
  // all sessions together; < 0 = the default share of the engine's memory.
  int64_t max_staging_bytes = -1;
  // Compute calls waiting for staging memory at once; beyond it a call is
  // refused (RESOURCE_EXHAUSTED). A waiting call also ends at its deadline.
  int64_t max_queued_calls = 256;
  int64_t max_concurrent_streams = 64;  // flce.v1 calls in progress; 0 = no limit
  int64_t max_heads = 0;                // resident heads; 0 = no limit
  // Resident head bytes; 0 = no limit, < 0 = the default share of the
  // engine's memory (less workspace and staging).
  int64_t max_head_bytes = -1;
  // Bytes that unfinished uploads may reserve, all together; < 0 = as
  // max_head_bytes.
  int64_t max_upload_bytes = -1;
  absl::Duration session_ttl = absl::Hours(1);
  std::string head_root;       // empty = LoadHeadFromFile refused
  std::string checkpoint_dir;  // empty = SaveCheckpoint / LoadCheckpoint refused
  // Also listen on this Unix-domain socket: same-host clients, containers
  // included, reach the server as a local peer through it. "auto": a path
  // private to this user (unix_socket_path.h); empty or "none": no socket.
  std::string unix_socket;
  // --local-transports: the regions clients on this host may hand hidden and
  // grad_input over in (Regions) instead of messages: shared memory (shm) and
  // device memory on the engine's GPU (cuda_ipc, CUDA engine only); who may
  // (local_transports_same_uid: only clients on the server's Unix socket
  // whose uid is the server's; else any client on this host). flce-server's
  // default ("auto") is both kinds for the same uid; this struct's is none.
  bool shm_transport = false;
  bool cuda_ipc_transport = false;
  bool local_transports_same_uid = false;
  // "auto": cuda_ipc goes without a warning where the engine has no GPU.
  bool local_transports_auto = false;
  // Region bytes one tenant may hold registered at once (shared memory, which
  // the CUDA engine page-locks, and CUDA IPC memory opened); 0 = no cap.
  int64_t max_region_bytes_per_tenant = int64_t{8} << 30;
  absl::Duration region_lease = absl::Seconds(60);  // a Regions stream silent longer is released
  // --data-port: hidden rows and grad_input as raw bytes on TCP connections
  // beside gRPC (ComputeHeader.data_plane), on the host of `address`.
  // kDataPortNone = no data plane, 0 = a free port (FlceServer::data_port()
  // says which), kDataPortAuto = a free port unless the server uses TLS.
  // Plaintext only: a port asked for with TLS is refused. flce-server's
  // default is auto; this struct's is none.
  static constexpr int kDataPortNone = -1;
  static constexpr int kDataPortAuto = -2;
  int data_port = kDataPortNone;
  // Preloaded head; empty head_file = the embedded demo head (if enabled).
  std::string head_file;
  std::string head_tensor = "lm_head.weight";
  std::string head_bias_tensor;
  std::string head_id = "demo";
  bool embedded_demo_head = true;
  absl::Duration drain = absl::Seconds(30);
  // TLS: PEM files. With tls_client_ca, clients must present a certificate it
  // signed (mutual TLS). All empty = plaintext.
  std::string tls_cert;
  std::string tls_key;
  std::string tls_client_ca;
  // `token tenant [admin]` lines, reread on SIGHUP; empty = no auth (one
  // anonymous tenant with admin rights).
  std::string auth_token_file;
  int threads = 0;      // engine threads; 0 = hardware concurrency
  int rpc_threads = 4;  // workers for unary RPCs, uploads and fetches
  // How often the sweeper looks for idle sessions and the engine's health.
  absl::Duration sweep_interval = absl::Seconds(1);
};

}  // namespace flce::server

#endif  // FLCE_SERVER_BASE_SERVER_CONFIG_H_
