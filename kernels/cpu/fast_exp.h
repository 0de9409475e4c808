// A branch-free expf the compiler can vectorise (std::exp cannot be, without
// -ffast-math, which would change every other rounding in the engine too).
// Cody-Waite range reduction and Cephes' degree-6 polynomial: within 2 ulp of
// std::exp on [-87, 88]; below -87 it returns ~1e-38 instead of underflowing
// to 0, which no sum here can notice.
#ifndef FLCE_KERNELS_CPU_FAST_EXP_H_
#define FLCE_KERNELS_CPU_FAST_EXP_H_

#include <cstdint>
#include <cstring>

namespace flce::cpu {

inline float FastExp(float x) {
  x = x < -87.0f ? -87.0f : x;
  x = x > 88.0f ? 88.0f : x;
  // Adding 1.5 * 2^23 rounds to the nearest integer in fp32 arithmetic.
  const float kRound = 12582912.0f;
  const float n = (x * 1.44269504088896341f + kRound) - kRound;
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float e = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return e * scale;
}

}  // namespace flce::cpu

#endif  // FLCE_KERNELS_CPU_FAST_EXP_H_
