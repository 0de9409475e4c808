// The wire's DType enum, its names on the command line ("fp32", "fp16",
// "bf16") and its element sizes.
#ifndef FLCE_CLIENT_CPP_WIRE_DTYPE_H_
#define FLCE_CLIENT_CPP_WIRE_DTYPE_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/dtype.h"
#include "flce/v1/convert.h"
#include "flce/v1/flce.pb.h"

namespace flce {

// "fp32" | "fp16" | "bf16" (also "float32", "float16", "bfloat16").
absl::StatusOr<v1::DType> ParseWireDType(absl::string_view name);
// "fp32", "fp16", "bf16", or "unspecified".
const char* WireDTypeName(v1::DType dtype);
// Bytes per element; 0 for DTYPE_UNSPECIFIED.
int64_t WireDTypeSize(v1::DType dtype);
// The wire <-> engine mapping itself: DTypeFromProto / DTypeToProto.

}  // namespace flce

#endif  // FLCE_CLIENT_CPP_WIRE_DTYPE_H_
