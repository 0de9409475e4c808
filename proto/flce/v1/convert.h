// The wire's DType <-> the engine's DType: the one mapping the server and the
// C++ client share.
//
// Usage:
//   FLCE_ASSIGN_OR_RETURN(DType dtype, DTypeFromProto(header.hidden_dtype(),
//   "hidden_dtype")); info.set_dtype(DTypeToProto(head.spec().dtype));
#ifndef FLCE_PROTO_FLCE_V1_CONVERT_H_
#define FLCE_PROTO_FLCE_V1_CONVERT_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "flce/v1/flce.pb.h"
#include "kernels/dtype.h"

namespace flce {

// INVALID_ARGUMENT naming `field` for DTYPE_UNSPECIFIED or an unknown value.
absl::StatusOr<DType> DTypeFromProto(v1::DType dtype, absl::string_view field = "dtype");
v1::DType DTypeToProto(DType dtype);

// An enum value as an error message shows it: "DTYPE_UNSPECIFIED (0)", or
// just the number for a value the enum does not define (proto3 keeps those).
std::string EnumValueText(const google::protobuf::EnumDescriptor* type, int value);

}  // namespace flce

#endif  // FLCE_PROTO_FLCE_V1_CONVERT_H_
