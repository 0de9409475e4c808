#include "server/service_context.h"

#include "absl/strings/str_cat.h"
#include "server/log.h"
#include "server/status_mapping.h"

namespace flce::server {

RpcScope::RpcScope(Metrics* metrics, const char* rpc)
    : metrics_(metrics), rpc_(rpc), start_(absl::Now()) {
  if (metrics_ != nullptr) metrics_->InflightAdd(rpc_, 1);
}

RpcScope::~RpcScope() {
  if (!done_) Done(grpc::Status(grpc::StatusCode::CANCELLED, "never finished"));
}

void RpcScope::Done(const grpc::Status& status) {
  if (done_) return;
  done_ = true;
  switch (status.error_code()) {
    case grpc::StatusCode::INTERNAL:
    case grpc::StatusCode::UNKNOWN:
    case grpc::StatusCode::DATA_LOSS:
    case grpc::StatusCode::UNAVAILABLE:
      // The server's own failures; client mistakes are the client's to log.
      LogWarning(absl::StrCat(rpc_, " failed: ", GrpcCodeName(status.error_code()), ": ",
                              status.error_message()));
      break;
    default:
      break;
  }
  if (metrics_ == nullptr) return;
  metrics_->InflightAdd(rpc_, -1);
  metrics_->RecordRequest(rpc_, status.error_code(), absl::ToDoubleSeconds(absl::Now() - start_));
}

absl::Status EngineStatus(const Engine& engine, absl::Status status) {
  if (status.ok() || engine.healthy()) return status;
  return absl::UnavailableError(
      absl::StrCat("the engine failed and is no longer serving: ", status.message()));
}

}  // namespace flce::server
