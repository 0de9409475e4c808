#include "client/cpp/wire_dtype.h"

#include "absl/strings/str_cat.h"

namespace flce {

absl::StatusOr<v1::DType> ParseWireDType(absl::string_view name) {
  if (name == "fp32" || name == "float32") return v1::DTYPE_FP32;
  if (name == "fp16" || name == "float16") return v1::DTYPE_FP16;
  if (name == "bf16" || name == "bfloat16") return v1::DTYPE_BF16;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown dtype '", name, "': expected fp32, fp16 or bf16"));
}

const char* WireDTypeName(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_FP32:
      return "fp32";
    case v1::DTYPE_FP16:
      return "fp16";
    case v1::DTYPE_BF16:
      return "bf16";
    default:
      return "unspecified";
  }
}

int64_t WireDTypeSize(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_FP32:
      return 4;
    case v1::DTYPE_FP16:
    case v1::DTYPE_BF16:
      return 2;
    default:
      return 0;
  }
}

}  // namespace flce
