#include "server/service_context.h"

#include "absl/strings/str_cat.h"

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
  if (metrics_ == nullptr) return;
  metrics_->InflightAdd(rpc_, -1);
  metrics_->RecordRequest(rpc_, status.error_code(),
                          absl::ToDoubleSeconds(absl::Now() - start_));
}

absl::Status EngineStatus(const Engine& engine, absl::Status status) {
  if (status.ok() || engine.healthy()) return status;
  return absl::UnavailableError(
      absl::StrCat("the engine failed and is no longer serving: ", status.message()));
}

}  // namespace flce::server
