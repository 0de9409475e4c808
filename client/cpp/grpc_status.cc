#include "client/cpp/grpc_status.h"

namespace flce {

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  const int code = static_cast<int>(status.error_code());
  // Codes outside google.rpc.Code cannot come from a conforming peer; keep
  // them visible as UNKNOWN rather than casting to an invalid enum value.
  if (code < 1 || code > 16) {
    return absl::UnknownError(status.error_message());
  }
  return absl::Status(static_cast<absl::StatusCode>(code), status.error_message());
}

}  // namespace flce
