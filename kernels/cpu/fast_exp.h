// A branch-free expf (and a tanh built on it) the compiler can vectorise (std::exp cannot be, without
// -ffast-math, which would change every other rounding in the engine too).
// Cody-Waite range reduction and Cephes' degree-6 polynomial: within 2 ulp of
// std::exp on [-87, 88]; below -87 it returns ~1e-38 instead of underflowing
// to 0, which no sum here can notice.
#ifndef FLCE_KERNELS_CPU_FAST_EXP_H_
#define FLCE_KERNELS_CPU_FAST_EXP_H_

#include <cmath>
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

// tanh(x), and sech^2(x) = 1 - tanh^2(x) into *sech2, branch-free for the
// vectoriser (std::tanh is not vectorised, and costs a softcapped row pass
// several times a plain one's time: docs/perf/cpu.md). Both come from
// e = exp(-2|x|): tanh|x| = (1 - e) / (1 + e) and sech^2 x = 4e / (1 + e)^2,
// which stays accurate where tanh rounds to +-1 and 1 - tanh^2 would cancel
// to nothing. Below |x| = 0.625, where 1 - e cancels instead, tanh takes
// Cephes' tanhf polynomial.
inline float FastTanh(float x, float* sech2) {
  const float ax = std::fabs(x);
  const float e = FastExp(-2.0f * ax);
  const float one_plus_e = 1.0f + e;
  *sech2 = 4.0f * e / (one_plus_e * one_plus_e);
  const float large = (1.0f - e) / one_plus_e;
  const float z = ax * ax;
  float p = -5.70498872745e-3f;
  p = p * z + 2.06390887954e-2f;
  p = p * z - 5.37397155531e-2f;
  p = p * z + 1.33314422036e-1f;
  p = p * z - 3.33332819422e-1f;
  const float small = p * z * ax + ax;
  return std::copysign(ax < 0.625f ? small : large, x);
}

}  // namespace flce::cpu

#endif  // FLCE_KERNELS_CPU_FAST_EXP_H_
