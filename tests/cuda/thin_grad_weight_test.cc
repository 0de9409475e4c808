// LaunchThinGradWeight (kernels/cuda/ops/thin_grad_weight.cuh), grad_W's
// streaming pass for chunks of a few rows: every accumulator entry against
// a float64 reference of init + sum_t d[t, v] x[t, k], and bit for bit against
// the kernel's own order (one fused multiply-add per row, in row order), for
// each dtype, its four-wide path and its one-element path (H % 4 != 0, x off
// alignment), and a row stride of d wider than the vocabulary.
#include "kernels/cuda/ops/thin_grad_weight.cuh"

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "gtest/gtest.h"
#include "tests/cuda/cuda_test_util.h"

namespace flce::test {
namespace {

using cuda::kThinGradWeightRows;
using cuda::LaunchThinGradWeight;
using cuda::UseThinGradWeight;

struct Case {
  DType dtype;
  int64_t rows, cols, hidden, ld_d;
  size_t x_offset_elems;  // 1 takes the one-element path
};

class ThinGradWeightTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override { SKIP_WITHOUT_CUDA_DEVICE(); }
};

TEST_P(ThinGradWeightTest, MatchesReference) {
  const Case c = GetParam();
  std::mt19937 rng(static_cast<uint32_t>(std::random_device{}()));
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> d(static_cast<size_t>(c.rows * c.ld_d)),
      x(static_cast<size_t>(c.rows * c.hidden)), gw(static_cast<size_t>(c.cols * c.hidden));
  for (float& v : d) v = dist(rng);
  for (float& v : x) v = dist(rng);
  for (float& v : gw) v = dist(rng);
  RoundTo(c.dtype, d.data(), static_cast<int64_t>(d.size()));
  RoundTo(c.dtype, x.data(), static_cast<int64_t>(x.size()));
  std::vector<uint8_t> d_bytes(d.size() * DTypeSize(c.dtype)),
      x_bytes(x.size() * DTypeSize(c.dtype));
  FromFloat(c.dtype, d.data(), d_bytes.data(), static_cast<int64_t>(d.size()));
  FromFloat(c.dtype, x.data(), x_bytes.data(), static_cast<int64_t>(x.size()));

  char *dev_d = nullptr, *dev_x = nullptr;
  float* dev_gw = nullptr;
  const size_t x_off = c.x_offset_elems * DTypeSize(c.dtype);
  ASSERT_EQ(cudaMalloc(&dev_d, d_bytes.size()), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dev_x, x_bytes.size() + x_off), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dev_gw, gw.size() * 4), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dev_d, d_bytes.data(), d_bytes.size(), cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dev_x + x_off, x_bytes.data(), x_bytes.size(), cudaMemcpyHostToDevice),
            cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dev_gw, gw.data(), gw.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_TRUE(LaunchThinGradWeight(c.dtype, dev_d, c.ld_d, dev_x + x_off, c.rows, c.cols, c.hidden,
                                   dev_gw, nullptr, nullptr)
                  .ok());
  std::vector<float> got(gw.size());
  ASSERT_EQ(cudaMemcpy(got.data(), dev_gw, got.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  cudaFree(dev_d);
  cudaFree(dev_x);
  cudaFree(dev_gw);

  int64_t off_reference = 0, off_order = 0;
  for (int64_t v = 0; v < c.cols; ++v) {
    for (int64_t k = 0; k < c.hidden; ++k) {
      const size_t i = static_cast<size_t>(v * c.hidden + k);
      double exact = gw[i], magnitude = std::fabs(gw[i]);
      float ordered = gw[i];
      for (int64_t t = 0; t < c.rows; ++t) {
        const float a = d[static_cast<size_t>(t * c.ld_d + v)];
        const float b = x[static_cast<size_t>(t * c.hidden + k)];
        exact += static_cast<double>(a) * b;
        magnitude += std::fabs(static_cast<double>(a) * b);
        ordered = std::fmaf(a, b, ordered);
      }
      // fp32 accumulation: one rounding per row added.
      if (!(std::fabs(got[i] - exact) <= 1e-6 * (c.rows + 1) * magnitude)) ++off_reference;
      if (std::memcmp(&got[i], &ordered, 4) != 0) ++off_order;
    }
  }
  EXPECT_EQ(off_reference, 0) << "entries off the float64 reference";
  EXPECT_EQ(off_order, 0) << "entries not bit-equal to the row-ordered fused multiply-adds";
}

INSTANTIATE_TEST_SUITE_P(Paths, ThinGradWeightTest,
                         ::testing::Values(Case{DType::kBF16, 1, 1000, 896, 1000, 0},
                                           Case{DType::kBF16, 8, 1000, 896, 1024, 0},
                                           Case{DType::kBF16, 3, 257, 37, 300, 0},
                                           Case{DType::kBF16, 5, 513, 64, 513, 1},
                                           Case{DType::kF16, 2, 777, 128, 800, 0},
                                           Case{DType::kF16, 7, 301, 130, 301, 0},
                                           Case{DType::kF32, 4, 640, 96, 700, 0},
                                           Case{DType::kF32, 6, 99, 33, 99, 1}));

TEST(ThinGradWeightRange, RefusesMoreRowsThanItsBound) {
  const cuda::KernelSwitches defaults;
  EXPECT_TRUE(UseThinGradWeight(defaults, kThinGradWeightRows));
  EXPECT_FALSE(UseThinGradWeight(defaults, kThinGradWeightRows + 1));
  EXPECT_FALSE(UseThinGradWeight(defaults, 0));
  const absl::Status st =
      LaunchThinGradWeight(DType::kBF16, nullptr, 10, nullptr, kThinGradWeightRows + 1, 10, 10,
                           nullptr, nullptr, nullptr);
  EXPECT_EQ(st.code(), absl::StatusCode::kInternal) << st;
}

}  // namespace
}  // namespace flce::test
