#include "flce/v1/convert.h"

#include "absl/strings/str_cat.h"

namespace flce {

absl::StatusOr<DType> DTypeFromProto(v1::DType dtype, absl::string_view field) {
  switch (dtype) {
    case v1::DTYPE_FP32:
      return DType::kF32;
    case v1::DTYPE_FP16:
      return DType::kF16;
    case v1::DTYPE_BF16:
      return DType::kBF16;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat(field, " = ", EnumValueText(v1::DType_descriptor(), dtype),
                       " is not one of DTYPE_FP32, DTYPE_FP16, DTYPE_BF16"));
  }
}

std::string EnumValueText(const google::protobuf::EnumDescriptor* type, int value) {
  const google::protobuf::EnumValueDescriptor* known = type->FindValueByNumber(value);
  if (known == nullptr) return absl::StrCat(value);
  return absl::StrCat(known->name(), " (", value, ")");
}

v1::DType DTypeToProto(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return v1::DTYPE_FP32;
    case DType::kF16:
      return v1::DTYPE_FP16;
    case DType::kBF16:
      return v1::DTYPE_BF16;
  }
  return v1::DTYPE_UNSPECIFIED;
}

}  // namespace flce
