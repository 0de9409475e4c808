// The one place where an absl::Status (engine, registry, validation) becomes
// the grpc::Status a client sees. Abseil's codes carry gRPC's names and
// numbers, so the mapping keeps the code and the message.
#ifndef FLCE_SERVER_BASE_STATUS_MAPPING_H_
#define FLCE_SERVER_BASE_STATUS_MAPPING_H_

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace flce::server {

grpc::Status ToGrpcStatus(const absl::Status& status);

// "OK", "INVALID_ARGUMENT", ...: the label metrics use.
const char* GrpcCodeName(grpc::StatusCode code);

}  // namespace flce::server

#endif  // FLCE_SERVER_BASE_STATUS_MAPPING_H_
