// Element types on the wire and in engine memory, and exact host conversions.
#ifndef FLCE_CORE_DTYPE_H_
#define FLCE_CORE_DTYPE_H_

#include <cstdint>

namespace flce {

enum class DType { kF32, kF16, kBF16 };

int64_t DTypeSize(DType dtype);
const char* DTypeName(DType dtype);  // "fp32", "fp16", "bf16"

// bf16 -> fp32 is exact; fp32 -> bf16 rounds to nearest even (NaN stays NaN).
float Bf16ToFloat(uint16_t bits);
uint16_t FloatToBf16(float value);
// IEEE half: exact widening; narrowing rounds to nearest even.
float HalfToFloat(uint16_t bits);
uint16_t FloatToHalf(float value);

// count elements of `dtype` at src into fp32 at dst.
void ToFloat(DType dtype, const void* src, float* dst, int64_t count);
// count fp32 at src into `dtype` at dst.
void FromFloat(DType dtype, const float* src, void* dst, int64_t count);
// Rounds fp32 values in place to what `dtype` can hold (identity for fp32).
void RoundTo(DType dtype, float* values, int64_t count);

// Index of the first element that is NaN or +-Inf, or -1.
int64_t FirstNonFinite(DType dtype, const void* data, int64_t count);

}  // namespace flce

#endif  // FLCE_CORE_DTYPE_H_
