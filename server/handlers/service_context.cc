#include "server/handlers/service_context.h"

#include "absl/strings/str_cat.h"
#include "server/base/status_mapping.h"
#include "server/observe/log.h"
#include "server/observe/request_log.h"

namespace flce::server {
namespace {
std::atomic<uint64_t> g_call_counter{0};
}  // namespace

RpcScope::RpcScope(const ServiceContext& ctx, const char* rpc)
    : ctx_(ctx),
      rpc_(rpc),
      start_(absl::Now()),
      call_number_(++g_call_counter),
      phase_start_(start_) {
  ctx_.active_calls.fetch_add(1);
  if (ctx_.metrics != nullptr) ctx_.metrics->InflightAdd(rpc_, 1);
}

RpcScope::~RpcScope() {
  if (!done_) Done(grpc::Status(grpc::StatusCode::CANCELLED, "never finished"));
}

void RpcScope::mark_phase(const char* name) {
  const absl::Time now = absl::Now();
  phases_ms_.emplace_back(name, absl::ToDoubleMilliseconds(now - phase_start_));
  phase_start_ = now;
}

void RpcScope::Done(const grpc::Status& status) {
  if (done_) return;
  done_ = true;
  ctx_.active_calls.fetch_sub(1);
  double seconds = absl::ToDoubleSeconds(absl::Now() - start_);
  RequestLogLine line;
  line.id = request_id_.empty() ? absl::StrCat("#", call_number_) : request_id_;
  line.rpc = rpc_;
  line.tenant = tenant_;
  line.head = head_;
  line.session = session_;
  line.tokens = tokens_;
  line.strategy = strategy_;
  line.kernels = kernels_;
  line.transport = transport_;
  line.phases_ms = std::move(phases_ms_);
  line.input_wait_ms = input_wait_ms_;
  line.seconds = seconds;
  line.code = GrpcCodeName(status.error_code());
  line.message = status.error_message();
  switch (status.error_code()) {
    case grpc::StatusCode::INTERNAL:
    case grpc::StatusCode::UNKNOWN:
    case grpc::StatusCode::DATA_LOSS:
    case grpc::StatusCode::UNAVAILABLE:
      // The server's own failures stand out; client mistakes stay at info.
      LogRequestLine(LogLevel::kWarning, line);
      break;
    default:
      LogRequestLine(LogLevel::kInfo, line);
      break;
  }
  if (ctx_.metrics == nullptr) return;
  ctx_.metrics->InflightAdd(rpc_, -1);
  ctx_.metrics->RecordRequest(rpc_, status.error_code(), seconds);
}

absl::StatusOr<Principal> Admit(const ServiceContext& ctx, const grpc::CallbackServerContext& call,
                                RpcScope& scope) {
  absl::StatusOr<Principal> who = ctx.auth != nullptr
                                      ? ctx.auth->Authenticate(call.client_metadata())
                                      : absl::StatusOr<Principal>(Principal{"", true});
  if (!who.ok()) return who.status();
  scope.set_tenant(who->tenant);
  scope.set_peer(call.peer());
  int64_t limit = ctx.config.max_concurrent_streams;
  if (limit > 0 && ctx.active_calls.load() > limit) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "too many calls in progress: --max-concurrent-streams=", limit, "; retry later"));
  }
  return who;
}

absl::Status EngineStatus(const Engine& engine, absl::Status status) {
  if (status.ok() || engine.healthy()) return status;
  return absl::UnavailableError(
      absl::StrCat("the engine failed and is no longer serving: ", status.message()));
}

}  // namespace flce::server
