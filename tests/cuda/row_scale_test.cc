// LaunchScaleRows (kernels/cuda/ops/row_scaled_backward.cuh), the pass that sums
// the grad_input slabs and applies K_t, and scales the hidden rows for
// grad_W: its eight-wide path (cols % 8 == 0, 16-byte aligned buffers) and
// its one-element path against the same float arithmetic on the host, bit
// for bit; outputs poisoned with NaN so unwritten elements show.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "gtest/gtest.h"
#include "kernels/cuda/ops/row_scaled_backward.cuh"
#include "tests/cuda/cuda_test_util.h"

namespace flce::test {
namespace {

struct Case {
  DType in, out;
  int64_t rows, cols;
  int parts;
  size_t offset_bytes;  // added to both buffers: 8 takes the one-element path
  bool fallback;        // *fallback != 0: the sum unscaled
};

// The kernel's arithmetic: parts summed in order in float, times the row's
// scale, rounded once to the output type.
std::vector<uint8_t> Expected(const Case& c, const std::vector<float>& in,
                              const std::vector<float>& scale) {
  const int64_t n = c.rows * c.cols;
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    float s = in[i];
    for (int p = 1; p < c.parts; ++p) s += in[p * n + i];
    v[i] = s * (c.fallback ? 1.0f : scale[i / c.cols]);
  }
  std::vector<uint8_t> bytes(static_cast<size_t>(n) * DTypeSize(c.out));
  FromFloat(c.out, v.data(), bytes.data(), n);
  return bytes;
}

class RowScaleTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override { SKIP_WITHOUT_CUDA_DEVICE(); }
};

TEST_P(RowScaleTest, MatchesHostArithmetic) {
  const Case c = GetParam();
  const int64_t n = c.rows * c.cols;
  std::mt19937 rng(static_cast<uint32_t>(std::random_device{}()));
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> in(static_cast<size_t>(n * c.parts)), scale(static_cast<size_t>(c.rows));
  for (float& x : in) x = dist(rng);
  for (float& x : scale) x = std::exp(dist(rng));
  RoundTo(c.in, in.data(), static_cast<int64_t>(in.size()));
  std::vector<uint8_t> in_bytes(in.size() * DTypeSize(c.in));
  FromFloat(c.in, in.data(), in_bytes.data(), static_cast<int64_t>(in.size()));

  char *d_in = nullptr, *d_out = nullptr;
  float* d_scale = nullptr;
  int32_t* d_fallback = nullptr;
  const size_t out_bytes = static_cast<size_t>(n) * DTypeSize(c.out);
  ASSERT_EQ(cudaMalloc(&d_in, in_bytes.size() + c.offset_bytes), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d_out, out_bytes + c.offset_bytes), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d_scale, scale.size() * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d_fallback, 4), cudaSuccess);
  ASSERT_EQ(
      cudaMemcpy(d_in + c.offset_bytes, in_bytes.data(), in_bytes.size(), cudaMemcpyHostToDevice),
      cudaSuccess);
  ASSERT_EQ(cudaMemset(d_out, 0xff, out_bytes + c.offset_bytes), cudaSuccess);  // NaN poison
  ASSERT_EQ(cudaMemcpy(d_scale, scale.data(), scale.size() * 4, cudaMemcpyHostToDevice),
            cudaSuccess);
  const int32_t fallback = c.fallback ? 1 : 0;
  ASSERT_EQ(cudaMemcpy(d_fallback, &fallback, 4, cudaMemcpyHostToDevice), cudaSuccess);

  const absl::Status st =
      cuda::LaunchScaleRows(c.in, d_in + c.offset_bytes, c.out, d_out + c.offset_bytes, c.rows,
                            c.cols, d_scale, d_fallback, nullptr, nullptr, c.parts);
  ASSERT_TRUE(st.ok()) << st;
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<uint8_t> got(out_bytes);
  ASSERT_EQ(cudaMemcpy(got.data(), d_out + c.offset_bytes, out_bytes, cudaMemcpyDeviceToHost),
            cudaSuccess);
  const std::vector<uint8_t> want = Expected(c, in, scale);
  int64_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    const size_t w = DTypeSize(c.out);
    if (std::memcmp(&got[i * w], &want[i * w], w) != 0 && bad++ < 5) {
      ADD_FAILURE() << "element " << i << " (row " << i / c.cols << ") differs";
    }
  }
  EXPECT_EQ(bad, 0);
  cudaFree(d_in);
  cudaFree(d_out);
  cudaFree(d_scale);
  cudaFree(d_fallback);
}

INSTANTIATE_TEST_SUITE_P(
    EightWideAndOneByOne, RowScaleTest,
    ::testing::Values(
        // grad_input: three fp32 slabs into bf16 (the eight-wide path), H = 136.
        Case{DType::kF32, DType::kBF16, 37, 136, 3, 0, false},
        // The same with the chunk fallen back: summed, not scaled.
        Case{DType::kF32, DType::kBF16, 37, 136, 3, 0, true},
        // One slab into fp32 output.
        Case{DType::kF32, DType::kF32, 5, 1024, 1, 0, false},
        // Hidden rows for grad_W: bf16 to bf16, then off 16-byte alignment
        // and with cols % 8 != 0 (the one-element path).
        Case{DType::kBF16, DType::kBF16, 129, 896, 1, 0, false},
        Case{DType::kBF16, DType::kBF16, 129, 896, 1, 8, false},
        Case{DType::kBF16, DType::kF16, 3, 133, 1, 0, false},
        Case{DType::kF32, DType::kBF16, 7, 133, 2, 0, false}));

}  // namespace
}  // namespace flce::test
