#include "client/cli/tensor_files.h"

#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "client/cpp/npy.h"
#include "client/cpp/wire_dtype.h"
#include "core/dtype.h"
#include "core/status_macros.h"

namespace flce::cli {
namespace {

absl::StatusOr<v1::DType> FileDType(const std::string& path, NpyType type,
                                    const std::string& dtype_flag) {
  switch (type) {
    case NpyType::kF32:
      return v1::DTYPE_FP32;
    case NpyType::kF16:
      return v1::DTYPE_FP16;
    case NpyType::kU16:
      // NumPy has no bf16: a uint16 file is bf16 only when the caller says so.
      if (dtype_flag != "bf16") {
        return absl::InvalidArgumentError(
            absl::StrCat(path, ": a '<u2' .npy is read as bf16 bits only with --dtype bf16"));
      }
      return v1::DTYPE_BF16;
    default:
      return absl::InvalidArgumentError(absl::StrCat(path, ": dtype '", NpyDescr(type),
                                                     "' is not a float tensor; expected '<f4', "
                                                     "'<f2' or '<u2' (bf16)"));
  }
}

NpyType NpyTypeOf(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_FP16:
      return NpyType::kF16;
    case v1::DTYPE_BF16:
      return NpyType::kU16;
    default:
      return NpyType::kF32;
  }
}

}  // namespace

absl::StatusOr<WireTensor> ReadFloatTensor(const std::string& path, const std::string& dtype_flag) {
  FLCE_ASSIGN_OR_RETURN(NpyArray array, ReadNpy(path));
  FLCE_ASSIGN_OR_RETURN(v1::DType file_dtype, FileDType(path, array.type, dtype_flag));
  WireTensor tensor;
  tensor.shape = array.shape;
  tensor.dtype = file_dtype;
  if (!dtype_flag.empty()) {
    FLCE_ASSIGN_OR_RETURN(tensor.dtype, ParseWireDType(dtype_flag));
  }
  if (tensor.dtype == file_dtype) {
    tensor.bytes = std::move(array.data);
    return tensor;
  }
  FLCE_ASSIGN_OR_RETURN(DType from, DTypeFromProto(file_dtype));
  FLCE_ASSIGN_OR_RETURN(DType to, DTypeFromProto(tensor.dtype));
  const int64_t n = array.NumElements();
  std::vector<float> values(n);
  ToFloat(from, array.data.data(), values.data(), n);
  tensor.bytes.resize(n * DTypeSize(to));
  FromFloat(to, values.data(), tensor.bytes.data(), n);
  return tensor;
}

absl::StatusOr<Targets> ReadTargets(const std::string& path) {
  FLCE_ASSIGN_OR_RETURN(NpyArray array, ReadNpy(path));
  Targets targets;
  targets.shape = array.shape;
  const int64_t n = array.NumElements();
  targets.values.resize(n);
  if (array.type == NpyType::kI32) {
    std::memcpy(targets.values.data(), array.data.data(), n * 4);
    return targets;
  }
  if (array.type != NpyType::kI64) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": targets must be '<i4' or '<i8', not '", NpyDescr(array.type), "'"));
  }
  for (int64_t i = 0; i < n; ++i) {
    int64_t value;
    std::memcpy(&value, array.data.data() + i * 8, 8);
    if (value < std::numeric_limits<int32_t>::min() ||
        value > std::numeric_limits<int32_t>::max()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": targets[", i, "] = ", value, " does not fit int32"));
    }
    targets.values[i] = static_cast<int32_t>(value);
  }
  return targets;
}

absl::StatusOr<std::vector<float>> ReadFloat32(const std::string& path, int64_t n) {
  FLCE_ASSIGN_OR_RETURN(NpyArray array, ReadNpy(path));
  if (array.type != NpyType::kF32) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": expected '<f4', not '", NpyDescr(array.type), "'"));
  }
  if (array.NumElements() != n) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", array.NumElements(),
                                                   " elements, expected one per token (", n, ")"));
  }
  std::vector<float> values(n);
  std::memcpy(values.data(), array.data.data(), n * 4);
  return values;
}

absl::StatusOr<std::vector<int32_t>> ReadInt32PerToken(const std::string& flag,
                                                       const std::string& path, int64_t n) {
  FLCE_ASSIGN_OR_RETURN(Targets ints, ReadTargets(path));
  if (static_cast<int64_t>(ints.values.size()) != n) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, " ", path, " has ",
                                                   ints.values.size(), " entries, expected ", n,
                                                   " (one per token)"));
  }
  return std::move(ints.values);
}

absl::Status WriteWireTensor(const std::string& path, const WireTensor& tensor) {
  return WriteNpy(path, NpyArray{NpyTypeOf(tensor.dtype), tensor.shape, tensor.bytes});
}

absl::Status WriteFloat32(const std::string& path, const std::vector<int64_t>& shape,
                          const std::vector<float>& values) {
  NpyArray array{NpyType::kF32, shape, {}};
  array.data.assign(reinterpret_cast<const char*>(values.data()), values.size() * 4);
  return WriteNpy(path, array);
}

absl::Status WriteUint8(const std::string& path, const std::vector<int64_t>& shape,
                        const std::vector<uint8_t>& values) {
  NpyArray array{NpyType::kU8, shape, {}};
  array.data.assign(reinterpret_cast<const char*>(values.data()), values.size());
  return WriteNpy(path, array);
}

}  // namespace flce::cli
