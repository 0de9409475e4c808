#include "core/dtype.h"

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

// The conversions with internal linkage: the bulk loops below inline them (a
// position-independent build cannot inline the exported functions) and
// vectorize; branch-free for the same reason.
template <typename To, typename From>
To BitCast(From from) {
  static_assert(sizeof(To) == sizeof(From), "same size");
  To to;
  std::memcpy(&to, &from, sizeof(to));
  return to;
}

float WidenBf16Bits(uint16_t bits) { return BitCast<float>(static_cast<uint32_t>(bits) << 16); }

uint16_t NarrowToBf16Bits(float value) {
  const uint32_t word = BitCast<uint32_t>(value);
  const uint32_t rounded = (word + 0x7fffu + ((word >> 16) & 1u)) >> 16;  // nearest, ties to even
  const uint32_t quiet_nan = (word >> 16) | 0x0040u;                      // sign kept
  return static_cast<uint16_t>((word & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}

// fp16 -> fp32: exponent and mantissa move up 13 bits and the exponent is
// rebased (+112); all-ones exponents (Inf, NaN with its payload) rebase to
// 255; a subnormal m is read as the normal 2^-14 (1 + m/1024) minus 2^-14,
// which the fp32 subtraction does exactly.
float WidenHalfBits(uint16_t bits) {
  const uint32_t shifted = (static_cast<uint32_t>(bits) & 0x7fffu) << 13;
  const uint32_t exponent = shifted & 0x0f800000u;
  const uint32_t normal = shifted + 0x38000000u;
  const uint32_t inf_nan = shifted + 0x70000000u;
  const uint32_t subnormal =
      BitCast<uint32_t>(BitCast<float>(normal + 0x00800000u) - BitCast<float>(0x38800000u));
  const uint32_t magnitude =
      exponent == 0x0f800000u ? inf_nan : (exponent == 0 ? subnormal : normal);
  return BitCast<float>(magnitude | ((static_cast<uint32_t>(bits) & 0x8000u) << 16));
}

// fp32 -> fp16, nearest with ties to even. Normal results: rebase the
// exponent (-112) and round the 13 dropped bits with the +0xfff + odd trick
// (a carry rounds into the exponent, up to Inf past 65504). Subnormal results
// (|x| < 2^-14): adding 0.5 in fp32 rounds x at 2^-24, the half subnormal
// step, and the low bits of the sum are the result. Inf stays Inf; NaN
// becomes the quiet NaN 0x7e00 (payload dropped, sign kept).
uint16_t NarrowToHalfBits(float value) {
  const uint32_t word = BitCast<uint32_t>(value);
  const uint32_t sign = word & 0x80000000u;
  const uint32_t magnitude = word ^ sign;
  const uint32_t normal = (magnitude + 0xc8000fffu + ((magnitude >> 13) & 1u)) >> 13;
  const uint32_t subnormal =
      BitCast<uint32_t>(BitCast<float>(magnitude) + 0.5f) - BitCast<uint32_t>(0.5f);
  const uint32_t inf_nan = magnitude > 0x7f800000u ? 0x7e00u : 0x7c00u;
  const uint32_t half =
      magnitude >= 0x47800000u ? inf_nan : (magnitude < 0x38800000u ? subnormal : normal);
  return static_cast<uint16_t>(half | (sign >> 16));
}

}  // namespace

float Bf16ToFloat(uint16_t bits) { return WidenBf16Bits(bits); }

uint16_t FloatToBf16(float value) { return NarrowToBf16Bits(value); }

float HalfToFloat(uint16_t bits) { return WidenHalfBits(bits); }

uint16_t FloatToHalf(float value) { return NarrowToHalfBits(value); }

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

// Bulk conversions over blocks of a constant size, which the compiler
// vectorizes (the servers convert every hidden and grad_input byte); the tail
// goes element by element.
constexpr int64_t kConvertBlock = 1024;

template <typename In, typename Out, Out (*kConvert)(In)>
void ConvertAll(const In* in, Out* out, int64_t count) {
  int64_t base = 0;
  for (; base + kConvertBlock <= count; base += kConvertBlock) {
    for (int64_t i = 0; i < kConvertBlock; ++i) out[base + i] = kConvert(in[base + i]);
  }
  for (; base < count; ++base) out[base] = kConvert(in[base]);
}

}  // namespace

void ToFloat(DType dtype, const void* src, float* dst, int64_t count) {
  if (count <= 0) return;  // memcpy with a null pointer is undefined even for 0 bytes
  switch (dtype) {
    case DType::kF32:
      std::memcpy(dst, src, static_cast<size_t>(count) * sizeof(float));
      return;
    case DType::kBF16:
      ConvertAll<uint16_t, float, WidenBf16Bits>(static_cast<const uint16_t*>(src), dst, count);
      return;
    case DType::kF16:
      ConvertAll<uint16_t, float, WidenHalfBits>(static_cast<const uint16_t*>(src), dst, count);
      return;
  }
}

void FromFloat(DType dtype, const float* src, void* dst, int64_t count) {
  if (count <= 0) return;
  switch (dtype) {
    case DType::kF32:
      std::memcpy(dst, src, static_cast<size_t>(count) * sizeof(float));
      return;
    case DType::kBF16:
      ConvertAll<float, uint16_t, NarrowToBf16Bits>(src, static_cast<uint16_t*>(dst), count);
      return;
    case DType::kF16:
      ConvertAll<float, uint16_t, NarrowToHalfBits>(src, static_cast<uint16_t*>(dst), count);
      return;
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
