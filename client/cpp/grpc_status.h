// grpc::Status -> absl::Status. The two code enums share their values (both
// are google.rpc.Code), so the code and message survive unchanged.
#ifndef FLCE_CLIENT_CPP_GRPC_STATUS_H_
#define FLCE_CLIENT_CPP_GRPC_STATUS_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace flce {

absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace flce

#endif  // FLCE_CLIENT_CPP_GRPC_STATUS_H_
