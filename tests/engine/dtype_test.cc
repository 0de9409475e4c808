// The wire dtypes against an independent decoder written with ldexp: every
// bf16 and fp16 bit pattern widens exactly, and narrowing picks the nearest
// representable value with ties to even, overflow to Inf and NaN kept.
#include "core/dtype.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>

#include "gtest/gtest.h"

namespace flce {
namespace {

// IEEE-style decode of a 16-bit pattern with `mantissa_bits` and an exponent bias.
double Decode16(uint16_t bits, int mantissa_bits, int exponent_bits) {
  const int bias = (1 << (exponent_bits - 1)) - 1;
  const int sign = bits >> 15;
  const int exponent = (bits >> mantissa_bits) & ((1 << exponent_bits) - 1);
  const int mantissa = bits & ((1 << mantissa_bits) - 1);
  double magnitude;
  if (exponent == (1 << exponent_bits) - 1) {
    magnitude = mantissa == 0 ? std::numeric_limits<double>::infinity()
                              : std::numeric_limits<double>::quiet_NaN();
  } else if (exponent == 0) {
    magnitude = std::ldexp(static_cast<double>(mantissa), 1 - bias - mantissa_bits);
  } else {
    magnitude = std::ldexp(static_cast<double>(mantissa + (1 << mantissa_bits)),
                           exponent - bias - mantissa_bits);
  }
  return sign ? -magnitude : magnitude;
}
double DecodeBf16(uint16_t bits) { return Decode16(bits, 7, 8); }
double DecodeHalf(uint16_t bits) { return Decode16(bits, 10, 5); }

TEST(DTypeTest, EveryBf16PatternWidensExactly) {
  for (uint32_t b = 0; b <= 0xffff; ++b) {
    const double expected = DecodeBf16(static_cast<uint16_t>(b));
    const float got = Bf16ToFloat(static_cast<uint16_t>(b));
    if (std::isnan(expected)) {
      EXPECT_TRUE(std::isnan(got)) << std::hex << b;
    } else {
      EXPECT_EQ(static_cast<double>(got), expected) << std::hex << b;
    }
  }
}

TEST(DTypeTest, EveryHalfPatternWidensExactly) {
  for (uint32_t b = 0; b <= 0xffff; ++b) {
    const double expected = DecodeHalf(static_cast<uint16_t>(b));
    const float got = HalfToFloat(static_cast<uint16_t>(b));
    if (std::isnan(expected)) {
      EXPECT_TRUE(std::isnan(got)) << std::hex << b;
    } else {
      EXPECT_EQ(static_cast<double>(got), expected) << std::hex << b;
    }
  }
}

// Narrowing x gave r: no other finite pattern may be closer, and on a tie the
// chosen pattern's last mantissa bit is 0.
void ExpectNearestEven(float x, uint16_t r, double (*decode)(uint16_t), double max_finite) {
  const double xd = x;
  const double got = decode(r);
  if (std::fabs(xd) > max_finite) {
    // Beyond the largest finite value: either Inf or max_finite, whichever is nearer
    // under round-to-nearest (overflow threshold is halfway to the next binade step).
    EXPECT_TRUE(std::isinf(got) || std::fabs(got) == max_finite) << x;
    return;
  }
  ASSERT_FALSE(std::isnan(got)) << x;
  const double error = std::fabs(got - xd);
  for (int delta : {-1, 1}) {
    const uint16_t neighbour = static_cast<uint16_t>(r + delta);
    const double other = decode(neighbour);
    if (std::isnan(other) || std::isinf(other)) continue;
    if ((neighbour & 0x8000) != (r & 0x8000) && other != 0.0) continue;
    const double other_error = std::fabs(other - xd);
    EXPECT_LE(error, other_error) << "x=" << x << " r=" << std::hex << r;
    if (error == other_error) EXPECT_EQ(r & 1, 0) << "tie not to even: x=" << x;
  }
}

float RandomFloat(std::mt19937& rng, int min_exponent, int max_exponent) {
  std::uniform_int_distribution<int> exponent(min_exponent, max_exponent);
  std::uniform_real_distribution<float> mantissa(1.0f, 2.0f);
  const float value = std::ldexp(mantissa(rng), exponent(rng));
  return (rng() & 1) ? -value : value;
}

TEST(DTypeTest, NarrowingToBf16RoundsToNearestEven) {
  std::mt19937 rng(20261129);
  for (int i = 0; i < 200000; ++i) {
    const float x = RandomFloat(rng, -133, 127);
    ExpectNearestEven(x, FloatToBf16(x), DecodeBf16, 3.3895313892515355e38);
  }
  // Exact ties: 1 + 2^-8 lies halfway between 1 and 1 + 2^-7: even (1) wins.
  EXPECT_EQ(FloatToBf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  EXPECT_EQ(FloatToBf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
}

TEST(DTypeTest, NarrowingToHalfRoundsToNearestEvenIncludingSubnormals) {
  std::mt19937 rng(11292026);
  for (int i = 0; i < 200000; ++i) {
    const float x = RandomFloat(rng, -26, 16);
    ExpectNearestEven(x, FloatToHalf(x), DecodeHalf, 65504.0);
  }
  EXPECT_EQ(FloatToHalf(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // tie to even
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -24)), 0x0001);         // smallest subnormal
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -25)), 0x0000);         // tie to even: 0
  EXPECT_EQ(FloatToHalf(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7c00);  // rounds past 65504
  EXPECT_EQ(FloatToHalf(65519.0f), 0x7bff);
}

TEST(DTypeTest, SpecialValuesSurviveNarrowing) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(FloatToBf16(inf), 0x7f80);
  EXPECT_EQ(FloatToBf16(-inf), 0xff80);
  EXPECT_EQ(FloatToHalf(inf), 0x7c00);
  EXPECT_EQ(FloatToHalf(-0.0f), 0x8000);
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(nan))));
  EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(nan))));
  // A NaN whose payload sits only in the low bits must not round to Inf.
  uint32_t low_payload_nan = 0x7f800001u;
  float x;
  std::memcpy(&x, &low_payload_nan, sizeof(x));
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(x))));
  EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(x))));
}

TEST(DTypeTest, BulkConversionsMatchTheScalarOnes) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> values(1001);
  for (float& v : values) v = normal(rng);
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    std::vector<uint8_t> bytes(values.size() * DTypeSize(dtype));
    FromFloat(dtype, values.data(), bytes.data(), static_cast<int64_t>(values.size()));
    std::vector<float> back(values.size());
    ToFloat(dtype, bytes.data(), back.data(), static_cast<int64_t>(values.size()));
    std::vector<float> rounded = values;
    RoundTo(dtype, rounded.data(), static_cast<int64_t>(rounded.size()));
    for (size_t i = 0; i < values.size(); ++i) {
      EXPECT_EQ(back[i], rounded[i]) << DTypeName(dtype) << " at " << i;
    }
  }
  ToFloat(DType::kBF16, nullptr, nullptr, 0);  // empty conversions touch nothing
  FromFloat(DType::kF16, nullptr, nullptr, 0);
}

// Every kind of float32 bit pattern (normals, subnormals, ties, Inf, NaN with
// any payload) over several of the bulk loops' internal blocks plus a tail:
// bit for bit the scalar conversions, for both 16-bit dtypes.
TEST(DTypeTest, Bulk16BitConversionsAreTheScalarOnesBitForBit) {
  std::mt19937 rng(11);
  const int64_t n = 3 * 1024 + 77;
  std::vector<uint32_t> words(n);
  for (uint32_t& w : words) w = static_cast<uint32_t>(rng());
  // Half of them in fp16's range, where its normal, subnormal and overflow
  // paths split.
  for (int64_t i = 0; i < n; i += 2)
    words[i] = 0x33000000u + static_cast<uint32_t>(rng()) % 0x15000000u;
  words[5] = 0x7f800000u;     // +Inf
  words[6] = 0xff800001u;     // NaN, payload in the low bits only
  words[1500] = 0x3f808000u;  // a bf16 tie: rounds to even
  words[1502] = 0x3f801000u;  // an fp16 tie: rounds to even
  words[1504] = 0x477ff000u;  // 65520: rounds past 65504 to Inf
  words[1506] = 0x33000000u;  // 2^-25, half the smallest fp16 subnormal: ties to 0
  words[1508] = 0x387fe000u;  // just under 2^-14: rounds up into the normals
  words[n - 1] = 0x7fc00000u;
  std::vector<float> values(n);
  std::memcpy(values.data(), words.data(), n * sizeof(float));
  for (DType dtype : {DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(DTypeName(dtype));
    const bool bf16 = dtype == DType::kBF16;
    std::vector<uint16_t> narrow(n);
    FromFloat(dtype, values.data(), narrow.data(), n);
    std::vector<float> wide(n);
    ToFloat(dtype, narrow.data(), wide.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(narrow[i], bf16 ? FloatToBf16(values[i]) : FloatToHalf(values[i]))
          << "at " << i << ", bits " << std::hex << words[i];
      const float expected = bf16 ? Bf16ToFloat(narrow[i]) : HalfToFloat(narrow[i]);
      ASSERT_EQ(std::memcmp(&wide[i], &expected, sizeof(float)), 0) << "at " << i;
    }
  }
}

// Every fp16 pattern through the bulk widening, and a dense sweep of float32
// patterns (every exponent, strided mantissas, both signs) through the bulk
// narrowing, each result checked as the nearest fp16 with ties to even.
TEST(DTypeTest, BulkHalfConversionsAreExactAndNearestEven) {
  std::vector<uint16_t> every(1 << 16);
  for (uint32_t b = 0; b <= 0xffff; ++b) every[b] = static_cast<uint16_t>(b);
  std::vector<float> wide(every.size());
  ToFloat(DType::kF16, every.data(), wide.data(), static_cast<int64_t>(every.size()));
  for (uint32_t b = 0; b <= 0xffff; ++b) {
    const double expected = DecodeHalf(static_cast<uint16_t>(b));
    if (std::isnan(expected)) {
      ASSERT_TRUE(std::isnan(wide[b])) << std::hex << b;
    } else {
      ASSERT_EQ(static_cast<double>(wide[b]), expected) << std::hex << b;
    }
  }
  std::vector<float> sweep;
  for (uint64_t w = 0x30000000u; w < 0x48000000u; w += 4099) {  // 2^-31 .. 2^17
    for (uint32_t sign : {0u, 0x80000000u}) {
      const uint32_t word = static_cast<uint32_t>(w) | sign;
      float x;
      std::memcpy(&x, &word, sizeof(x));
      sweep.push_back(x);
    }
  }
  std::vector<uint16_t> narrow(sweep.size());
  FromFloat(DType::kF16, sweep.data(), narrow.data(), static_cast<int64_t>(sweep.size()));
  for (size_t i = 0; i < sweep.size(); ++i) {
    ExpectNearestEven(sweep[i], narrow[i], DecodeHalf, 65504.0);
    if (::testing::Test::HasFailure()) FAIL() << "at " << sweep[i];
  }
}

TEST(DTypeTest, FirstNonFiniteFindsTheFirstBadElement) {
  std::vector<float> values(10, 1.0f);
  EXPECT_EQ(FirstNonFinite(DType::kF32, values.data(), 10), -1);
  values[7] = std::numeric_limits<float>::infinity();
  values[9] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(FirstNonFinite(DType::kF32, values.data(), 10), 7);
  for (DType dtype : {DType::kF16, DType::kBF16}) {
    std::vector<uint16_t> halves(10);
    FromFloat(dtype, values.data(), halves.data(), 10);
    EXPECT_EQ(FirstNonFinite(dtype, halves.data(), 10), 7) << DTypeName(dtype);
    EXPECT_EQ(FirstNonFinite(dtype, halves.data(), 7), -1) << DTypeName(dtype);
  }
  // 65504 is fp16's largest finite value; 1e5 overflows to Inf in fp16 only.
  const float big[2] = {65504.0f, 1e5f};
  std::vector<uint16_t> halves(2);
  FromFloat(DType::kF16, big, halves.data(), 2);
  EXPECT_EQ(FirstNonFinite(DType::kF16, halves.data(), 2), 1);
}

// Positions on both sides of the scan's internal block boundaries, in the
// tail, and two bad elements in one block: always the first index.
TEST(DTypeTest, FirstNonFiniteAcrossLongBuffers) {
  const int64_t n = 5000;
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (int64_t bad :
         {int64_t{0}, int64_t{1023}, int64_t{1024}, int64_t{2047}, int64_t{3001}, int64_t{4999}}) {
      std::vector<float> values(n, -2.5f);
      values[bad] = std::numeric_limits<float>::quiet_NaN();
      if (bad + 5 < n) values[bad + 5] = std::numeric_limits<float>::infinity();
      std::vector<uint8_t> bytes(n * DTypeSize(dtype));
      FromFloat(dtype, values.data(), bytes.data(), n);
      EXPECT_EQ(FirstNonFinite(dtype, bytes.data(), n), bad) << DTypeName(dtype) << " at " << bad;
      EXPECT_EQ(FirstNonFinite(dtype, bytes.data(), bad), -1) << DTypeName(dtype) << " before";
    }
  }
}

}  // namespace
}  // namespace flce
