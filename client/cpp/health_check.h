// grpc.health.v1.Health/Check without the health .proto. Debian ships no
// grpc/health/v1/health.proto, so the two tiny messages are encoded by hand
// and sent through grpc::GenericStub:
//   HealthCheckRequest  { string service = 1; }
//   HealthCheckResponse { ServingStatus status = 1; }  // varint: 1 SERVING, 2 NOT_SERVING
#ifndef FLCE_CLIENT_CPP_HEALTH_CHECK_H_
#define FLCE_CLIENT_CPP_HEALTH_CHECK_H_

#include <grpcpp/channel.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace flce {

// grpc.health.v1.HealthCheckResponse.ServingStatus, same values.
enum class HealthStatus {
  kUnknown = 0,
  kServing = 1,
  kNotServing = 2,
  kServiceUnknown = 3,
};

const char* HealthStatusName(HealthStatus status);  // "SERVING", ...

// The wire bytes of HealthCheckRequest{service}.
std::string EncodeHealthCheckRequest(absl::string_view service);
// Reads HealthCheckResponse.status, skipping any other field; a missing
// status is UNKNOWN (proto3 default). INVALID_ARGUMENT on malformed bytes.
absl::StatusOr<HealthStatus> DecodeHealthCheckResponse(absl::string_view bytes);

// One Check call. service "" asks about the server as a whole.
absl::StatusOr<HealthStatus> CheckHealth(const std::shared_ptr<grpc::Channel>& channel,
                                         absl::string_view service, absl::Duration timeout);

}  // namespace flce

#endif  // FLCE_CLIENT_CPP_HEALTH_CHECK_H_
