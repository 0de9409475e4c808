// flce-server: serves flce.v1.Flce (see proto/flce/v1/flce.proto).
//
//   flce-server --port 50051 --metrics-port 9464 --device auto
//
// With no head given it serves the embedded demo head "demo" (V=32000,
// H=512, bf16). SIGTERM / SIGINT: stop accepting, drain (--drain-seconds),
// exit 0. SIGHUP: reread --auth-token-file. An engine that fails for good: exit 1.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "server/base/data_port_flag.h"
#include "server/base/local_transports_flag.h"
#include "server/base/server_config.h"
#include "server/flce_server.h"
#include "server/observe/log.h"

ABSL_FLAG(int, port, 50051, "gRPC port (0 = any free port)");
ABSL_FLAG(std::string, host, "0.0.0.0", "address to listen on");
ABSL_FLAG(int, metrics_port, 9464, "Prometheus /metrics port (0 = off)");
ABSL_FLAG(std::string, log_level, "info",
          "lines below this level are not written: info, warning or error");
ABSL_FLAG(std::string, log_format, "text",
          "text (<time> <I|W|E> flce-server: <message>) or json (one object per line)");
ABSL_FLAG(std::string, metrics_host, "",
          "address /metrics listens on (empty = the same as --host)");
ABSL_FLAG(std::string, device, "auto", "cpu, cuda, or auto (CUDA if present, else CPU)");
ABSL_FLAG(int64_t, workspace_mb, 2048, "engine workspace budget in MiB (per GPU)");
ABSL_FLAG(std::string, gpus, "1",
          "GPUs to split every head's vocabulary across: a count N (GPUs 0..N-1), \"all\", or "
          "ordinals such as 0,1 (NCCL between them; an ordinal listed twice runs two shards "
          "on one GPU)");
ABSL_FLAG(int64_t, max_message_mb, 64, "largest gRPC message the server accepts, in MiB");
ABSL_FLAG(int64_t, max_response_mb, 4,
          "largest message the server sends, in MiB (4 = what a stock gRPC client accepts)");
ABSL_FLAG(int64_t, max_request_tokens, 1048576, "most tokens in one Compute call");
ABSL_FLAG(int64_t, max_sessions, 1024, "most gradient sessions alive at once");
ABSL_FLAG(int64_t, max_pending, 16,
          "most COMMIT_DEFERRED contributions per session, staged or still computing");
ABSL_FLAG(int64_t, max_staging_mb, -1,
          "MiB of fp32 staging buffers, all calls together (-1 = a quarter of the engine's "
          "memory less the workspace); calls beyond it wait");
ABSL_FLAG(int64_t, max_queued_calls, 256,
          "compute calls that may wait for staging memory at once; more are refused");
ABSL_FLAG(absl::Duration, session_ttl, absl::Hours(1),
          "sessions idle this long are dropped, staged contributions with them");
ABSL_FLAG(std::string, head_root, "",
          "directory LoadHeadFromFile may read from (empty = file loads refused)");
ABSL_FLAG(std::string, checkpoint_dir, "",
          "directory of SaveCheckpoint / LoadCheckpoint files, one subdirectory per tenant "
          "(empty = checkpoints refused)");
ABSL_FLAG(std::string, unix_socket, "auto",
          "also listen on this Unix-domain socket path (clients: unix:PATH); \"auto\": "
          "flce-<pid>.sock in a directory private to this user ($XDG_RUNTIME_DIR/flce, "
          "/run/flce as root, else /tmp/flce-<uid>), named to clients on this host, which send "
          "their tensors through it; \"none\": TCP only");
ABSL_FLAG(std::string, local_transports, "auto",
          "regions clients on this host may hand hidden and grad_input over in instead of "
          "messages: \"auto\" = shm (shared memory) and cuda_ipc (their memory on this "
          "server's GPU) for clients on the Unix socket that run as this server's user; "
          "\"none\"; a list such as \"shm,cuda_ipc\" = those for every client on this host "
          "(loopback TCP or the Unix socket, any user); \"same-uid:shm\" = those for the "
          "server's user only");
ABSL_FLAG(int64_t, max_region_mb, 8192,
          "MiB of regions one tenant may hold registered at once (shared memory, page-locked "
          "on a GPU, and CUDA IPC memory); 0 = no cap");
ABSL_FLAG(int, region_lease_s, 60,
          "a region registration stream that sends nothing for this long is released");
ABSL_FLAG(std::string, data_port, "auto",
          "TCP port of the data plane: Compute calls' hidden rows and grad_input as raw bytes "
          "beside gRPC, on --host; \"auto\" = any free port without TLS, none with it; "
          "\"none\" (or -1) = no data plane; 0 = any free port (refused with TLS)");
ABSL_FLAG(std::string, head_file, "", ".safetensors file to preload a head from");
ABSL_FLAG(std::string, head_tensor, "lm_head.weight", "weight tensor in --head-file");
ABSL_FLAG(std::string, head_bias_tensor, "", "bias tensor in --head-file (optional)");
ABSL_FLAG(std::string, head_id, "demo", "id of the preloaded head (or of the demo head)");
ABSL_FLAG(bool, demo_head, true, "serve the embedded demo head when no --head-file is given");
ABSL_FLAG(int, drain_seconds, 30, "on SIGTERM, how long calls in flight may take to finish");
ABSL_FLAG(int, threads, 0, "CPU engine threads (0 = all cores)");
ABSL_FLAG(int64_t, max_concurrent_streams, 64,
          "most flce.v1 calls in progress at once, all clients together (0 = "
          "no limit)");
ABSL_FLAG(int64_t, max_heads, 0, "most resident heads, all tenants together (0 = no limit)");
ABSL_FLAG(int64_t, max_head_bytes, -1,
          "most resident head bytes (weights + biases), all tenants together (0 = no limit, "
          "-1 = a share of the engine's memory less workspace and staging, logged at start)");
ABSL_FLAG(int64_t, max_upload_bytes, -1,
          "most head bytes that unfinished uploads and file loads may hold, all together "
          "(0 = no limit, -1 = as --max-head-bytes)");
ABSL_FLAG(std::string, tls_cert, "", "PEM server certificate (chain): serve gRPC over TLS");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls-cert");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM CA bundle: require client certificates it signed (mutual TLS)");
ABSL_FLAG(std::string, auth_token_file, "",
          "file of `token tenant [admin]` lines; calls need `authorization: Bearer <token>`; "
          "reread on SIGHUP (empty = no auth)");
ABSL_FLAG(std::string, cuda_plugin, "",
          "path of libflce_cuda.so (default: $FLCE_CUDA_PLUGIN, beside the binary, ...)");

namespace {

// Abseil spells flags with underscores; flce documents them with dashes
// (--metrics-port). Both are accepted: dashes in a flag's name become
// underscores, its value is left alone.
int g_signal_pipe[2] = {-1, -1};

void OnSignal(int signal) {
  unsigned char byte = static_cast<unsigned char>(signal);
  ssize_t unused = write(g_signal_pipe[1], &byte, 1);
  (void)unused;
}

std::vector<std::string> DashesToUnderscores(int argc, char** argv) {
  std::vector<std::string> args(argv, argv + argc);
  for (size_t i = 1; i < args.size(); ++i) {
    std::string& arg = args[i];
    if (arg == "--") break;
    if (arg.size() < 3 || arg[0] != '-' || arg[1] != '-') continue;
    size_t end = arg.find('=');
    if (end == std::string::npos) end = arg.size();
    for (size_t c = 2; c < end; ++c) {
      if (arg[c] == '-') arg[c] = '_';
    }
  }
  return args;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("flce-server: fused linear + cross-entropy LM-head service");
  // absl lists, for --help, only flags defined in a file named after the
  // binary (flce-server.cc); the flags live here, in main.cc.
  absl::FlagsUsageConfig usage;
  usage.contains_help_flags = [](absl::string_view file) {
    return absl::EndsWith(file, "server/main.cc");
  };
  usage.contains_helpshort_flags = usage.contains_help_flags;
  absl::SetFlagsUsageConfig(usage);
  std::vector<std::string> args = DashesToUnderscores(argc, argv);
  std::vector<char*> arg_ptrs;
  for (std::string& arg : args) arg_ptrs.push_back(arg.data());
  absl::ParseCommandLine(static_cast<int>(arg_ptrs.size()), arg_ptrs.data());

  // The log's shape first, so that every later line has it.
  absl::StatusOr<flce::server::LogLevel> level =
      flce::server::ParseLogLevel(absl::GetFlag(FLAGS_log_level));
  absl::StatusOr<flce::server::LogFormat> format =
      flce::server::ParseLogFormat(absl::GetFlag(FLAGS_log_format));
  if (!level.ok() || !format.ok()) {
    std::fprintf(stderr, "flce-server: %s\n",
                 std::string((level.ok() ? format.status() : level.status()).message()).c_str());
    return 2;
  }
  flce::server::SetLogLevel(*level);
  flce::server::SetLogFormat(*format);

  flce::server::ServerConfig config;
  config.address = absl::StrCat(absl::GetFlag(FLAGS_host), ":", absl::GetFlag(FLAGS_port));
  config.metrics_port = absl::GetFlag(FLAGS_metrics_port);
  config.metrics_host = absl::GetFlag(FLAGS_metrics_host);
  config.device = absl::GetFlag(FLAGS_device);
  config.cuda_plugin_path = absl::GetFlag(FLAGS_cuda_plugin);
  config.workspace_bytes = absl::GetFlag(FLAGS_workspace_mb) << 20;
  config.gpus = absl::GetFlag(FLAGS_gpus);
  config.max_message_bytes = absl::GetFlag(FLAGS_max_message_mb) << 20;
  config.max_response_bytes = absl::GetFlag(FLAGS_max_response_mb) << 20;
  config.max_request_tokens = absl::GetFlag(FLAGS_max_request_tokens);
  config.max_sessions = absl::GetFlag(FLAGS_max_sessions);
  config.max_pending = absl::GetFlag(FLAGS_max_pending);
  const int64_t staging_mb = absl::GetFlag(FLAGS_max_staging_mb);
  config.max_staging_bytes = staging_mb < 0 ? -1 : staging_mb << 20;
  config.max_queued_calls = absl::GetFlag(FLAGS_max_queued_calls);
  config.session_ttl = absl::GetFlag(FLAGS_session_ttl);
  config.head_root = absl::GetFlag(FLAGS_head_root);
  config.checkpoint_dir = absl::GetFlag(FLAGS_checkpoint_dir);
  config.unix_socket = absl::GetFlag(FLAGS_unix_socket);
  if (absl::Status s = ApplyLocalTransportsFlag(absl::GetFlag(FLAGS_local_transports), config);
      !s.ok()) {
    std::fprintf(stderr, "flce-server: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  if (absl::GetFlag(FLAGS_max_region_mb) < 0) {
    std::fprintf(stderr, "flce-server: --max-region-mb must be 0 (no cap) or more\n");
    return 2;
  }
  config.max_region_bytes_per_tenant = absl::GetFlag(FLAGS_max_region_mb) << 20;
  if (absl::GetFlag(FLAGS_region_lease_s) < 1) {
    std::fprintf(stderr, "flce-server: --region-lease-s must be at least 1\n");
    return 2;
  }
  config.region_lease = absl::Seconds(absl::GetFlag(FLAGS_region_lease_s));
  if (absl::Status s = ApplyDataPortFlag(absl::GetFlag(FLAGS_data_port), config); !s.ok()) {
    std::fprintf(stderr, "flce-server: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  config.head_file = absl::GetFlag(FLAGS_head_file);
  config.head_tensor = absl::GetFlag(FLAGS_head_tensor);
  config.head_bias_tensor = absl::GetFlag(FLAGS_head_bias_tensor);
  config.head_id = absl::GetFlag(FLAGS_head_id);
  config.embedded_demo_head = absl::GetFlag(FLAGS_demo_head);
  config.drain = absl::Seconds(absl::GetFlag(FLAGS_drain_seconds));
  config.threads = absl::GetFlag(FLAGS_threads);
  config.max_concurrent_streams = absl::GetFlag(FLAGS_max_concurrent_streams);
  config.max_heads = absl::GetFlag(FLAGS_max_heads);
  config.max_head_bytes = absl::GetFlag(FLAGS_max_head_bytes);
  config.max_upload_bytes = absl::GetFlag(FLAGS_max_upload_bytes);
  config.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  config.tls_key = absl::GetFlag(FLAGS_tls_key);
  config.tls_client_ca = absl::GetFlag(FLAGS_tls_client_ca);
  config.auth_token_file = absl::GetFlag(FLAGS_auth_token_file);

  // A handler that only writes to a pipe (async-signal-safe, whichever
  // thread takes the signal: libraries such as OpenBLAS start threads before
  // main, so masking signals here cannot route them to one thread).
  if (pipe2(g_signal_pipe, O_CLOEXEC) != 0) {
    flce::server::LogError("cannot create the signal pipe");
    return 2;
  }
  struct sigaction action = {};
  action.sa_handler = OnSignal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGHUP, &action, nullptr);

  auto server = flce::server::FlceServer::Create(config);
  if (!server.ok()) {
    flce::server::LogError(absl::StrCat("cannot start: ", server.status().ToString()));
    return 2;
  }
  flce::server::FlceServer* running = server->get();
  std::thread([running] {
    while (true) {
      unsigned char signal = 0;
      while (read(g_signal_pipe[0], &signal, 1) < 0 && errno == EINTR) {
      }
      if (signal == SIGHUP) {
        running->ReloadAuth().IgnoreError();  // logged either way
        continue;
      }
      flce::server::LogInfo(
          absl::StrCat("signal ", signal == SIGTERM ? "SIGTERM" : "SIGINT", ": shutting down"));
      running->Shutdown();
      return;
    }
  }).detach();

  absl::Status stopped = running->Wait();
  server->reset();
  if (!stopped.ok()) {
    flce::server::LogError(stopped.ToString());
    return 1;
  }
  return 0;
}
