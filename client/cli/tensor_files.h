// .npy files as flce-client reads and writes them: float tensors in the
// wire's dtypes (bf16 as '<u2' bits), targets as int32.
#ifndef FLCE_CLIENT_CLI_TENSOR_FILES_H_
#define FLCE_CLIENT_CLI_TENSOR_FILES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "flce/v1/flce.pb.h"

namespace flce::cli {

struct WireTensor {
  v1::DType dtype = v1::DTYPE_FP32;
  std::vector<int64_t> shape;
  std::string bytes;  // little-endian elements of dtype
};

// Reads a float tensor. '<f4' is fp32 and '<f2' fp16; '<u2' holds bf16 bits
// and is accepted only with dtype_flag "bf16". dtype_flag "" keeps the file's
// dtype; another one converts (rounding to nearest even).
absl::StatusOr<WireTensor> ReadFloatTensor(const std::string& path, const std::string& dtype_flag);

// Reads targets from '<i4' or '<i8' (any shape, flattened in C order);
// int64 values outside int32 are INVALID_ARGUMENT naming the first.
struct Targets {
  std::vector<int64_t> shape;
  std::vector<int32_t> values;
};
absl::StatusOr<Targets> ReadTargets(const std::string& path);

// Reads fp32 per-token weights ('<f4' only), n elements in any shape.
absl::StatusOr<std::vector<float>> ReadFloat32(const std::string& path, int64_t n);

// Reads '<i4' or '<i8' integers (any shape) that must number n, one per
// token; errors name `flag` and the file.
absl::StatusOr<std::vector<int32_t>> ReadInt32PerToken(const std::string& flag,
                                                       const std::string& path, int64_t n);

// A vector's elements as the little-endian bytes a message's array field holds.
template <typename T>
std::string ArrayBytes(const std::vector<T>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
}

// fp32 -> '<f4', fp16 -> '<f2', bf16 -> '<u2'.
absl::Status WriteWireTensor(const std::string& path, const WireTensor& tensor);
absl::Status WriteFloat32(const std::string& path, const std::vector<int64_t>& shape,
                          const std::vector<float>& values);
absl::Status WriteUint8(const std::string& path, const std::vector<int64_t>& shape,
                        const std::vector<uint8_t>& values);

}  // namespace flce::cli

#endif  // FLCE_CLIENT_CLI_TENSOR_FILES_H_
