#include "kernels/dtype.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace flce {

int64_t DTypeSize(DType dtype) { return dtype == DType::kF32 ? 4 : 2; }

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "fp32";
    case DType::kF16:
      return "fp16";
    case DType::kBF16:
      return "bf16";
  }
  return "unknown";
}

namespace {

// The bf16 conversions with internal linkage: the bulk loops below inline
// them (a position-independent build cannot inline the exported functions)
// and vectorize; branch-free for the same reason.
float WidenBf16Bits(uint16_t bits) {
  const uint32_t word = static_cast<uint32_t>(bits) << 16;
  float out;
  std::memcpy(&out, &word, sizeof(out));
  return out;
}

uint16_t NarrowToBf16Bits(float value) {
  uint32_t word;
  std::memcpy(&word, &value, sizeof(word));
  const uint32_t rounded = (word + 0x7fffu + ((word >> 16) & 1u)) >> 16;  // nearest, ties to even
  const uint32_t quiet_nan = (word >> 16) | 0x0040u;                      // sign kept
  return static_cast<uint16_t>((word & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}

}  // namespace

float Bf16ToFloat(uint16_t bits) { return WidenBf16Bits(bits); }

uint16_t FloatToBf16(float value) { return NarrowToBf16Bits(value); }

float HalfToFloat(uint16_t bits) {
  uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  uint32_t exponent = (bits >> 10) & 0x1fu;
  uint32_t mantissa = bits & 0x3ffu;
  uint32_t word;
  if (exponent == 0x1f) {
    word = sign | 0x7f800000u | (mantissa << 13);
  } else if (exponent != 0) {
    word = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    word = sign;
  } else {  // subnormal half: normalise
    int shift = 0;
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      ++shift;
    }
    mantissa &= 0x3ffu;
    word = sign | (static_cast<uint32_t>(113 - shift) << 23) | (mantissa << 13);
  }
  float out;
  std::memcpy(&out, &word, sizeof(out));
  return out;
}

uint16_t FloatToHalf(float value) {
  uint32_t word;
  std::memcpy(&word, &value, sizeof(word));
  uint16_t sign = static_cast<uint16_t>((word >> 16) & 0x8000u);
  uint32_t abs = word & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // Inf or NaN
    return sign | 0x7c00u | (abs > 0x7f800000u ? 0x0200u : 0u);
  }
  if (abs >= 0x477ff000u) return sign | 0x7c00u;  // rounds past 65504: Inf
  int32_t exponent = static_cast<int32_t>(abs >> 23) - 127;
  if (exponent < -24) {
    // Below half the smallest subnormal (or exactly half: ties to even = 0).
    return abs > 0x33000000u ? static_cast<uint16_t>(sign | 1u) : sign;
  }
  uint32_t mantissa = (abs & 0x7fffffu) | 0x800000u;
  int shift = exponent < -14 ? (-14 - exponent) + 13 : 13;  // subnormal or normal
  uint32_t halfway = 1u << (shift - 1);
  uint32_t rest = mantissa & ((1u << shift) - 1);
  uint32_t rounded = mantissa >> shift;
  if (rest > halfway || (rest == halfway && (rounded & 1u))) ++rounded;
  if (exponent < -14) return sign | static_cast<uint16_t>(rounded);  // may carry into normal
  // Normal: rounded holds the implicit bit; a carry bumps the exponent naturally.
  uint32_t bits = (static_cast<uint32_t>(exponent + 15) << 10) + (rounded - 0x400u);
  return sign | static_cast<uint16_t>(bits);
}

namespace {

// Index of the first element whose exponent bits are all set, or -1. Blocks
// are tested with a branch-free OR over the block (which the compiler
// vectorizes; an early-exit loop it does not) and only a block holding a bad
// element is scanned for the index: the server runs this over every hidden
// byte it receives.
template <typename Word>
int64_t FirstWithExponent(const Word* words, int64_t count, Word mask) {
  constexpr int64_t kBlock = 1024;  // a constant trip count: vectorized at -O2 too
  int64_t base = 0;
  for (; base + kBlock <= count; base += kBlock) {
    const Word* block = words + base;
    Word any = 0;
    for (int64_t i = 0; i < kBlock; ++i) any |= static_cast<Word>((block[i] & mask) == mask);
    if (any != 0) break;
  }
  for (int64_t i = base; i < count; ++i) {
    if ((words[i] & mask) == mask) return i;
  }
  return -1;
}

// Bulk bf16 conversions over blocks of a constant size, which the compiler
// vectorizes (the servers convert every hidden and grad_input byte); the tail
// goes element by element.
constexpr int64_t kConvertBlock = 1024;

void WidenBf16(const uint16_t* in, float* out, int64_t count) {
  int64_t base = 0;
  for (; base + kConvertBlock <= count; base += kConvertBlock) {
    for (int64_t i = 0; i < kConvertBlock; ++i) out[base + i] = WidenBf16Bits(in[base + i]);
  }
  for (; base < count; ++base) out[base] = WidenBf16Bits(in[base]);
}

void NarrowToBf16(const float* in, uint16_t* out, int64_t count) {
  int64_t base = 0;
  for (; base + kConvertBlock <= count; base += kConvertBlock) {
    for (int64_t i = 0; i < kConvertBlock; ++i) out[base + i] = NarrowToBf16Bits(in[base + i]);
  }
  for (; base < count; ++base) out[base] = NarrowToBf16Bits(in[base]);
}

}  // namespace

void ToFloat(DType dtype, const void* src, float* dst, int64_t count) {
  if (count <= 0) return;  // memcpy with a null pointer is undefined even for 0 bytes
  switch (dtype) {
    case DType::kF32:
      std::memcpy(dst, src, static_cast<size_t>(count) * sizeof(float));
      return;
    case DType::kBF16:
      WidenBf16(static_cast<const uint16_t*>(src), dst, count);
      return;
    case DType::kF16: {
      const uint16_t* in = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < count; ++i) dst[i] = HalfToFloat(in[i]);
      return;
    }
  }
}

void FromFloat(DType dtype, const float* src, void* dst, int64_t count) {
  if (count <= 0) return;
  switch (dtype) {
    case DType::kF32:
      std::memcpy(dst, src, static_cast<size_t>(count) * sizeof(float));
      return;
    case DType::kBF16:
      NarrowToBf16(src, static_cast<uint16_t*>(dst), count);
      return;
    case DType::kF16: {
      uint16_t* out = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < count; ++i) out[i] = FloatToHalf(src[i]);
      return;
    }
  }
}

void RoundTo(DType dtype, float* values, int64_t count) {
  switch (dtype) {
    case DType::kF32:
      return;
    case DType::kBF16:
      for (int64_t i = 0; i < count; ++i) values[i] = Bf16ToFloat(FloatToBf16(values[i]));
      return;
    case DType::kF16:
      for (int64_t i = 0; i < count; ++i) values[i] = HalfToFloat(FloatToHalf(values[i]));
      return;
  }
}

int64_t FirstNonFinite(DType dtype, const void* data, int64_t count) {
  if (dtype == DType::kF32) {
    return FirstWithExponent(static_cast<const uint32_t*>(data), count, uint32_t{0x7f800000u});
  }
  // bf16 and fp16: all exponent bits set means Inf or NaN.
  const uint16_t exponent_mask = dtype == DType::kBF16 ? 0x7f80u : 0x7c00u;
  return FirstWithExponent(static_cast<const uint16_t*>(data), count, exponent_mask);
}

}  // namespace flce
