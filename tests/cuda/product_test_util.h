// Products checked against float64 (the own backward GEMMs and the cuBLAS
// algorithms of gemm_algos.h): 16-bit random operands rounded on the host so
// that the float copy is what the GPU sees, uploads and downloads, the float64
// products with the magnitudes of their terms, and the tolerance check.
#ifndef FLCE_TESTS_CUDA_PRODUCT_TEST_UTIL_H_
#define FLCE_TESTS_CUDA_PRODUCT_TEST_UTIL_H_

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "gtest/gtest.h"

namespace flce::test {

struct Shape {
  int64_t rows, cols, hidden;
};

// Rounded to `dtype`: the float copy is what the GPU sees.
inline std::vector<float> RandomRounded(DType dtype, int64_t n, float scale, std::mt19937* rng) {
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(*rng);
  RoundTo(dtype, v.data(), n);
  return v;
}

template <typename T>
inline T* Upload(const std::vector<T>& host) {
  T* dev = nullptr;
  EXPECT_EQ(cudaMalloc(&dev, host.size() * sizeof(T)), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(dev, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice),
            cudaSuccess);
  return dev;
}

inline void* Upload16(DType dtype, const std::vector<float>& v) {
  std::vector<uint16_t> bits(v.size());
  FromFloat(dtype, v.data(), bits.data(), static_cast<int64_t>(v.size()));
  return Upload(bits);
}

template <typename T>
inline std::vector<T> Download(const T* dev, size_t n) {
  std::vector<T> host(n);
  EXPECT_EQ(cudaMemcpy(host.data(), dev, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return host;
}

// |got - ref| within fp32 accumulation error of sum |terms|; a wrong layout
// gives errors of the order of the terms themselves.
inline void ExpectClose(const std::vector<double>& ref, const std::vector<double>& abs_sum,
                        const std::vector<float>& got, const char* what) {
  int64_t bad = 0;
  double worst = 0.0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - ref[i]);
    const double tol = 1e-4 * abs_sum[i] + 1e-6;
    if (!(err <= tol)) {
      if (bad++ < 5)
        ADD_FAILURE() << what << " element " << i << ": " << got[i] << " vs " << ref[i];
    }
    if (abs_sum[i] > 0) worst = std::max(worst, err / abs_sum[i]);
  }
  EXPECT_EQ(bad, 0) << what;
  std::printf("  %s: worst error / sum|terms| %.2e\n", what, worst);
}

// What the GPU should produce, in float64: for grad_input
// out[t, k] = sum_v d[t, v] m[v, k] (m = W); for grad_W
// out[v, k] = initial[v, k] + sum_t d[t, v] m[t, k] (m = X). abs_sum sums the
// terms' magnitudes (the scale of fp32 accumulation error).
struct Expected {
  std::vector<double> value, abs_sum;
};
inline Expected Float64Products(const std::vector<float>& d, const std::vector<float>& m,
                                const Shape& s, bool weight, const std::vector<float>& initial) {
  const size_t n = static_cast<size_t>((weight ? s.cols : s.rows) * s.hidden);
  Expected e{std::vector<double>(n, 0.0), std::vector<double>(n, 0.0)};
  for (size_t i = 0; i < initial.size(); ++i) {
    e.value[i] = initial[i];
    e.abs_sum[i] = std::fabs(initial[i]);
  }
  for (int64_t t = 0; t < s.rows; ++t) {
    for (int64_t v = 0; v < s.cols; ++v) {
      const double a = d[t * s.cols + v];
      const int64_t out_row = weight ? v : t;
      const int64_t m_row = weight ? t : v;
      for (int64_t k = 0; k < s.hidden; ++k) {
        const double term = a * m[m_row * s.hidden + k];
        e.value[out_row * s.hidden + k] += term;
        e.abs_sum[out_row * s.hidden + k] += std::fabs(term);
      }
    }
  }
  return e;
}

}  // namespace flce::test

#endif  // FLCE_TESTS_CUDA_PRODUCT_TEST_UTIL_H_
