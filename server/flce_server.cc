#include "server/flce_server.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <random>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "core/status_macros.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "kernels/engine_factory.h"
#include "server/base/receive_buffers.h"
#include "server/observe/log.h"
#include "server/rpc/transport_security.h"
#include "server/rpc/unix_socket_listener.h"
#include "server/rpc/unix_socket_path.h"
#include "server/state/memory_budget.h"
#include "server/storage/head_loader.h"
#include "server/validate/validation.h"

#ifndef FLCE_VERSION
#define FLCE_VERSION "0.0.0"
#endif

namespace flce::server {
namespace {

// --unix-socket: "auto" picks a private path (unix_socket_path.h) or, where
// there is none, logs why and leaves the server on TCP; "none" or empty: no
// socket; anything else is the path.
std::string ChooseUnixSocket(const std::string& flag) {
  if (flag.empty() || flag == "none") return "";
  if (flag != "auto") return flag;
  absl::StatusOr<std::string> path = AutoUnixSocketPath();
  if (path.ok()) return *path;
  LogWarning(absl::StrCat(path.status().message(), "; same-host clients use TCP"));
  return "";
}

// The host of a gRPC address, brackets off ("::1" of "[::1]:50051").
std::string ListenHost(const std::string& address) {
  size_t colon = address.rfind(':');
  std::string host = colon == std::string::npos ? address : address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return host;
}

// Where /metrics listens when --metrics-host is not given: the host of the
// gRPC address ("127.0.0.1" of "127.0.0.1:50051"). Debian's civetweb (under
// prometheus-cpp) binds IPv4 only, so IPv6's wildcard and loopback map to
// IPv4's; another IPv6 address fails the start, asking for --metrics-host.
std::string DefaultMetricsHost(const std::string& address) {
  const std::string host = ListenHost(address);
  if (host == "::") return "0.0.0.0";
  if (host == "::1") return "127.0.0.1";
  return host;
}

std::string RandomInstanceId() {
  std::random_device device;
  std::mt19937_64 rng((static_cast<uint64_t>(device()) << 32) ^ device());
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(rng()));
  return buf;
}

}  // namespace

absl::Status ParseGpus(const std::string& gpus, EngineConfig& config) {
  if (gpus == "all") {
    config.all_devices = true;
    return absl::OkStatus();
  }
  const auto bad = [&] {
    return absl::InvalidArgumentError(absl::StrCat(
        "--gpus=", gpus, " is not a count, \"all\" or a list of GPU ordinals such as 0,1"));
  };
  std::vector<int> list;
  for (absl::string_view part : absl::StrSplit(gpus, ',')) {
    int value = 0;
    if (!absl::SimpleAtoi(part, &value) || value < 0) return bad();
    list.push_back(value);
  }
  if (list.empty()) return bad();
  if (list.size() == 1 && gpus.find(',') == std::string::npos) {
    if (list[0] < 1) return bad();
    const int count = list[0];
    list.clear();
    for (int d = 0; d < count; ++d) list.push_back(d);
  }
  if (list.size() > 1) config.devices = list;
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Engine>> CreateEngine(const ServerConfig& config) {
  EngineConfig engine_config;
  engine_config.workspace_bytes = config.workspace_bytes;
  engine_config.threads = config.threads;
  FLCE_RETURN_IF_ERROR(ParseGpus(config.gpus, engine_config));
  const bool several = engine_config.all_devices || !engine_config.devices.empty();
  if (config.device == "cpu") {
    if (several) {
      return absl::InvalidArgumentError(
          absl::StrCat("--gpus=", config.gpus, " needs the CUDA engine, not --device=cpu"));
    }
    return CreateCpuEngine(engine_config);
  }
  if (config.device != "cuda" && config.device != "auto") {
    return absl::InvalidArgumentError(
        absl::StrCat("--device=", config.device, " is not one of cpu, cuda, auto"));
  }
  absl::StatusOr<std::unique_ptr<Engine>> cuda =
      LoadCudaEngine(engine_config, config.cuda_plugin_path);
  // Asked for several GPUs, a server never falls back to the CPU.
  if (cuda.ok() || config.device == "cuda" || several ||
      cuda.status().code() != absl::StatusCode::kUnavailable) {
    return cuda;
  }
  const std::string fallback = absl::StrCat("--device=auto: no CUDA engine (",
                                            cuda.status().message(), "); using the CPU engine");
  if (NvidiaGpuListed()) {
    // Serving on the CPU next to a GPU is almost never what was meant.
    LogWarning(absl::StrCat(fallback,
                            ", although the NVIDIA driver lists a GPU: pass "
                            "--cuda-plugin or set FLCE_CUDA_PLUGIN"));
  } else {
    LogInfo(fallback);
  }
  return CreateCpuEngine(engine_config);
}

absl::StatusOr<std::unique_ptr<FlceServer>> FlceServer::Create(const ServerConfig& config) {
  FLCE_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, CreateEngine(config));
  return Create(config, std::move(engine));
}

absl::StatusOr<std::unique_ptr<FlceServer>> FlceServer::Create(const ServerConfig& config,
                                                               std::unique_ptr<Engine> engine) {
  std::unique_ptr<FlceServer> server(new FlceServer());
  FLCE_RETURN_IF_ERROR(server->Start(config, std::move(engine)));
  return server;
}

absl::Status FlceServer::Start(const ServerConfig& config, std::unique_ptr<Engine> engine) {
  // A peer sending non-UTF-8 strings would otherwise get one unthrottled line per message.
  InstallProtobufLogHandler();
  if (config.max_message_bytes < (int64_t{64} << 10) ||
      config.max_message_bytes > (int64_t{2047} << 20)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max-message-mb gives ", config.max_message_bytes, " bytes; need 64 KiB to 2047 MiB"));
  }
  if (config.max_response_bytes < (int64_t{64} << 10) ||
      config.max_response_bytes > (int64_t{2047} << 20)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max-response-mb gives ", config.max_response_bytes, " bytes; need 64 KiB to 2047 MiB"));
  }
  engine_ = std::move(engine);
  LogInfo(absl::StrCat("engine: ", engine_->info().name));
  FLCE_ASSIGN_OR_RETURN(MemoryBudgets budgets,
                        ResolveMemoryBudgets(config, engine_->info(), HostMemoryBytes()));
  LogInfo(DescribeMemoryBudgets(budgets));
  uploads_.SetLimit(budgets.upload_bytes);
  SessionLimits limits;
  limits.max_sessions = config.max_sessions;
  limits.max_pending = config.max_pending;
  limits.ttl = config.session_ttl;
  sessions_ = std::make_unique<SessionStore>(engine_.get(), limits);
  staging_ = std::make_unique<StagingBudget>(budgets.staging_bytes, config.max_queued_calls);
  heads_.SetShapeGuard(
      [sessions = sessions_.get()](const std::string& owner, const std::string& head_id) {
        std::vector<std::string> ids = sessions->SessionIds(owner, head_id);
        if (ids.empty()) return absl::OkStatus();
        return absl::FailedPreconditionError(absl::StrCat(
            "head \"", head_id, "\" has sessions holding gradients of its current shape (",
            absl::StrJoin(ids, ", "),
            "): delete them (DeleteSession) or upload under another head_id"));
      });
  heads_.SetLimits(HeadLimits{config.max_heads, budgets.head_bytes});
  FLCE_ASSIGN_OR_RETURN(auth_, Authenticator::Create(config.auth_token_file));
  FLCE_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> credentials,
                        ServerCredentialsFor(config));
  const std::string metrics_host =
      config.metrics_host.empty() ? DefaultMetricsHost(config.address) : config.metrics_host;
  FLCE_ASSIGN_OR_RETURN(metrics_, Metrics::Create(metrics_host, config.metrics_port));
  pool_ = std::make_unique<WorkerPool>(config.rpc_threads);

  ctx_.config = config;
  ctx_.config.unix_socket = ChooseUnixSocket(config.unix_socket);
  // Handlers see the effective budgets, never the "default" marker.
  ctx_.config.max_head_bytes = budgets.head_bytes;
  ctx_.config.max_upload_bytes = budgets.upload_bytes;
  ctx_.config.max_staging_bytes = budgets.staging_bytes;
  ctx_.engine = engine_.get();
  ctx_.heads = &heads_;
  ctx_.sessions = sessions_.get();
  ctx_.staging = staging_.get();
  ctx_.metrics = metrics_.get();
  ctx_.auth = auth_.get();
  ctx_.pool = pool_.get();
  ctx_.workers = &workers_;
  ctx_.uploads = &uploads_;
  ctx_.checkpoints = &checkpoints_;
  // CUDA IPC needs an engine with a GPU (its info names the device).
  const bool has_gpu = !engine_->info().device_uuid.empty();
  if (config.cuda_ipc_transport && !has_gpu && !config.local_transports_auto) {
    LogWarning(absl::StrCat("--local-transports=cuda_ipc: the ", engine_->info().name,
                            " engine has no GPU; CUDA IPC is not offered"));
  }
  LocalTransportRule rule;
  rule.shm = config.shm_transport;
  rule.cuda_ipc = config.cuda_ipc_transport && has_gpu;
  rule.same_uid_only = config.local_transports_same_uid;
  peers_ = std::make_unique<LocalPeers>(rule, geteuid());
  ctx_.peers = peers_.get();
  pieces_ = std::make_unique<ComputePieces>();
  ctx_.pieces = pieces_.get();
  if (rule.shm || rule.cuda_ipc) {
    regions_ = std::make_unique<SharedRegions>(
        config.region_lease,
        SharedRegions::Kinds{rule.shm, rule.cuda_ipc ? engine_.get() : nullptr,
                             has_gpu ? engine_.get() : nullptr},
        config.max_region_bytes_per_tenant);
    ctx_.regions = regions_.get();
  }
  int data_port = config.data_port;
  if (data_port == ServerConfig::kDataPortAuto) {
    // The data plane is plaintext: under TLS every byte stays on gRPC.
    data_port = config.tls_cert.empty() ? 0 : ServerConfig::kDataPortNone;
  }
  if (data_port >= 0) {
    if (!config.tls_cert.empty()) {
      return absl::InvalidArgumentError(
          "--data-port with TLS: the data plane carries rows in plaintext; use one or the other");
    }
    DataPlaneListener::Options options;
    options.max_frame_bytes = config.max_message_bytes;
    FLCE_ASSIGN_OR_RETURN(data_listener_,
                          DataPlaneListener::Listen(ListenHost(config.address), data_port,
                                                    pieces_.get(), metrics_.get(), options));
    ctx_.data_plane_port = data_listener_->port();
  }
  ctx_.instance_id = RandomInstanceId();
  ctx_.version = FLCE_VERSION;
  FLCE_RETURN_IF_ERROR(PreloadHead());

  service_ = std::make_unique<FlceService>(&ctx_);
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(config.address, credentials, &port_);
  int unix_bound = 0;
  const std::string& unix_socket = ctx_.config.unix_socket;
  if (!unix_socket.empty() && config.tls_cert.empty()) {
    // Accepted by the server itself, so that a caller's uid is known there.
    FLCE_ASSIGN_OR_RETURN(unix_listener_, UnixSocketListener::Listen(unix_socket, peers_.get()));
  } else if (!unix_socket.empty()) {
    // A stale socket file from a server that died would make the bind fail.
    unlink(unix_socket.c_str());
    builder.AddListeningPort("unix:" + unix_socket, credentials, &unix_bound);
  }
  builder.SetMaxReceiveMessageSize(static_cast<int>(config.max_message_bytes));
  // Handlers split what they send to max_response_bytes; a single row wider
  // than that (H x 4 bytes) still goes out whole, up to max_message_bytes.
  builder.SetMaxSendMessageSize(
      static_cast<int>(std::max(config.max_message_bytes, config.max_response_bytes)));
  builder.RegisterService(service_.get());
  server_ = builder.BuildAndStart();
  if (server_ == nullptr || port_ == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", config.address));
  }
  if (unix_listener_ != nullptr) {
    unix_listener_->Start(server_.get());
  } else if (!unix_socket.empty() && unix_bound == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on unix:", unix_socket));
  }
  socket_file_ = RememberSocketFile(unix_socket);
  if (data_listener_ != nullptr) data_listener_->Start();
  server_->GetHealthCheckService()->SetServingStatus(true);
  LogSecurity(config, auth_->token_count());
  LogInfo(absl::StrCat("serving flce.v1.Flce on port ", port_,
                       unix_socket.empty() ? "" : absl::StrCat(" and unix:", unix_socket),
                       data_listener_ == nullptr
                           ? ""
                           : absl::StrCat(", data plane on port ", data_listener_->port()),
                       ", instance ", ctx_.instance_id,
                       metrics_->port() != 0 ? absl::StrCat(", /metrics on ", metrics_host,
                                                            " port ", metrics_->port())
                                             : std::string(", metrics not served")));
  housekeeping_ = std::thread([this] { Housekeeping(); });
  return absl::OkStatus();
}

absl::Status FlceServer::PreloadHead() {
  const ServerConfig& config = ctx_.config;
  std::shared_ptr<const Head> head;
  std::string source;
  UploadBudget::Reservation reservation;
  if (!config.head_file.empty()) {
    // A preloaded head counts against the same caps as an uploaded one,
    // checked before a byte of it is read.
    auto check = [&](const HeadSpec& spec) -> absl::Status {
      FLCE_RETURN_IF_ERROR(heads_.CheckPut(/*owner=*/"", config.head_id, spec));
      FLCE_ASSIGN_OR_RETURN(reservation, uploads_.Reserve(config.head_id, HeadBytes(spec)));
      return absl::OkStatus();
    };
    FLCE_ASSIGN_OR_RETURN(head, LoadSafetensorsHead(*engine_, config.head_file, config.head_tensor,
                                                    config.head_bias_tensor, std::nullopt, check));
    source = absl::StrCat("file:", config.head_file);
  } else if (config.embedded_demo_head) {
    FLCE_ASSIGN_OR_RETURN(head, BuildDemoHead(*engine_));
    source = "embedded-demo";
  } else {
    return absl::OkStatus();
  }
  FLCE_RETURN_IF_ERROR(ValidateId(config.head_id, "--head-id"));
  // Preloaded heads are shared: every tenant computes with them.
  FLCE_ASSIGN_OR_RETURN(HeadEntry entry,
                        heads_.Put(/*owner=*/"", config.head_id, std::move(head), source));
  const HeadSpec& spec = entry.head->spec();
  LogInfo(absl::StrCat("head \"", entry.head_id, "\" (", source, "): V=", spec.vocab_size,
                       " H=", spec.hidden_size, " ", DTypeName(spec.dtype),
                       spec.has_bias ? " with bias" : ""));
  return absl::OkStatus();
}

void FlceServer::Housekeeping() {
  while (true) {
    int64_t expired = sessions_->Sweep(absl::Now());
    if (expired > 0) {
      LogInfo(absl::StrCat(expired, " session(s) idle longer than --session-ttl dropped"));
    }
    Metrics::Snapshot gauges;
    std::vector<HeadEntry> heads = heads_.ListAll();
    gauges.heads = static_cast<int64_t>(heads.size());
    // Shared heads by id; tenants' heads all add up under one label (Metrics::HeadLabel).
    std::map<std::string, int64_t> weight_bytes;
    for (const HeadEntry& head : heads) {
      weight_bytes[Metrics::HeadLabel(head.owner, head.head_id)] += HeadBytes(head.head->spec());
      gauges.optimizer_state_bytes += head.training->state_bytes();
    }
    metrics_->SetHeadWeights(weight_bytes);
    for (const SessionSummary& s : sessions_->ListAll()) {
      ++gauges.sessions;
      if (s.pending > 0) ++gauges.sessions_with_pending;
    }
    EngineInfo info = engine_->info();
    gauges.workspace_peak_bytes = info.workspace_peak_bytes;
    gauges.workspace_budget_bytes = info.workspace_budget_bytes;
    gauges.gpu_memory_used = info.device_memory_used;
    gauges.gpu_memory_total = info.device_memory_total;
    gauges.held_rows_kept_bytes = HeldRowsKeptBytes();
    gauges.receive_buffers_kept_bytes =
        static_cast<int64_t>(ReceiveBuffers::Shared().kept_bytes());
    metrics_->SetGauges(gauges);

    if (!engine_->healthy()) {
      LogError("the engine reports an unrecoverable device error: not serving, stopping");
      {
        absl::MutexLock lock(&mu_);
        stop_reason_ = absl::UnavailableError("the engine became unhealthy");
      }
      // Calls in flight fail with UNAVAILABLE from their engine errors; no
      // drain: the device cannot finish them.
      StopServing(absl::ZeroDuration());
      return;
    }
    {
      absl::MutexLock lock(&mu_);
      auto stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; };
      if (mu_.AwaitWithTimeout(absl::Condition(&stopping), ctx_.config.sweep_interval)) return;
    }
  }
}

void FlceServer::StopServing(absl::Duration drain) {
  absl::MutexLock shutdown(&shutdown_mu_);
  {
    absl::MutexLock lock(&mu_);
    if (stopped_) return;
  }
  server_->GetHealthCheckService()->SetServingStatus(false);
  LogInfo(absl::StrCat("draining calls in flight (up to ", absl::FormatDuration(drain), ")"));
  // Registration streams never end by themselves; compute calls in flight
  // keep the regions they use mapped.
  if (regions_ != nullptr) regions_->CancelAllStreams();
  if (unix_listener_ != nullptr) unix_listener_->Stop();
  server_->Shutdown(std::chrono::system_clock::now() + absl::ToChronoSeconds(drain));
  // Compute workers finish after their reactors; wait before anything they
  // use goes away.
  if (!workers_.WaitIdle(drain + absl::Seconds(30))) {
    // Their calls are cancelled; they end at the engine's next step. The
    // engine, heads and sessions they use must outlive them: wait.
    LogWarning(absl::StrCat(workers_.active(),
                            " compute workers still running after the drain; waiting for them"));
    workers_.WaitIdle(absl::InfiniteDuration());
  }
  // After the calls: those in flight read their rows and send grad_input there.
  if (data_listener_ != nullptr) data_listener_->Stop();
  RemoveSocketFile(socket_file_);
  LogInfo("stopped");
  absl::MutexLock lock(&mu_);
  stopped_ = true;
}

void FlceServer::Shutdown() { StopServing(ctx_.config.drain); }

absl::Status FlceServer::ReloadAuth() {
  if (!auth_->enabled()) {
    LogInfo("SIGHUP: no --auth-token-file, nothing to reload");
    return absl::OkStatus();
  }
  absl::StatusOr<size_t> tokens = auth_->Reload();
  if (!tokens.ok()) {
    LogError(absl::StrCat("auth tokens not reloaded, the previous ones stay: ",
                          tokens.status().message()));
    return tokens.status();
  }
  LogInfo(absl::StrCat("auth tokens reloaded from ", ctx_.config.auth_token_file, ": ", *tokens,
                       " token(s)"));
  return absl::OkStatus();
}

absl::Status FlceServer::Wait() {
  absl::MutexLock lock(&mu_);
  auto stopped = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopped_; };
  mu_.Await(absl::Condition(&stopped));
  return stop_reason_;
}

FlceServer::~FlceServer() {
  if (server_ != nullptr) StopServing(absl::ZeroDuration());
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (housekeeping_.joinable()) housekeeping_.join();
  pool_.reset();  // its tasks may still refer to the sessions
}

}  // namespace flce::server
