// Reading and writing NumPy .npy files (format versions 1.0 and 2.0): the
// tensor files flce-client takes and writes. Only the element types flce
// moves are accepted, little-endian and in C order; anything else (Fortran
// order, big-endian data, other dtypes, truncated data) is an
// INVALID_ARGUMENT naming what is wrong, never a silent reinterpretation.
//
// bf16 has no NumPy dtype: it travels as '<u2' and the caller says (with a
// --dtype flag) that the uint16 values are bf16 bits.
//
// Usage:
//   FLCE_ASSIGN_OR_RETURN(NpyArray h, ReadNpy("h.npy"));
//   if (h.type != NpyType::kF32) ...;   h.shape == {BT, H}; h.data = raw bytes
//   FLCE_RETURN_IF_ERROR(WriteNpy("gx.npy", NpyArray{NpyType::kF32, {BT, H}, bytes}));
#ifndef FLCE_CLIENT_CPP_NPY_H_
#define FLCE_CLIENT_CPP_NPY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace flce {

enum class NpyType {
  kF32,  // '<f4'
  kF16,  // '<f2'
  kU16,  // '<u2' (bf16 bits)
  kI32,  // '<i4'
  kI64,  // '<i8'
  kU8,   // '|u1' (per-token correctness flags)
};

// The .npy descr string, e.g. "<f4".
const char* NpyDescr(NpyType type);
int64_t NpyItemSize(NpyType type);

struct NpyArray {
  NpyType type = NpyType::kF32;
  std::vector<int64_t> shape;  // C order; empty = a scalar
  std::string data;            // little-endian bytes, NumElements() * item size

  int64_t NumElements() const;
};

// Parses a whole .npy file held in memory.
absl::StatusOr<NpyArray> ParseNpy(absl::string_view bytes);
// Serialises to a .npy file: version 1.0, or 2.0 when the header needs it.
// INVALID_ARGUMENT when data's size does not match the shape.
absl::StatusOr<std::string> SerializeNpy(const NpyArray& array);

absl::StatusOr<NpyArray> ReadNpy(const std::string& path);
absl::Status WriteNpy(const std::string& path, const NpyArray& array);

}  // namespace flce

#endif  // FLCE_CLIENT_CPP_NPY_H_
