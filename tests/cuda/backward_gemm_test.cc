// The own Hopper backward GEMMs (kernels/cuda/ops/sm90/backward_gemm.cuh) against a
// float64 product of the same 16-bit inputs: odd shapes (rows, hidden and
// the vocabulary not multiples of the tiles), every split count, both 16-bit
// types; grad_input slabs poisoned with NaN so unwritten elements show, and
// grad_W accumulated onto random values so the reduce-add is checked too.
// Skips with the reason where the device is not compute capability 9.0.
#include "kernels/cuda/ops/sm90/backward_gemm.cuh"

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "gtest/gtest.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/cuda/product_test_util.h"

namespace flce::test {
namespace {

using cuda::BackwardGemmSupported;
using cuda::GradInputGemmArgs;
using cuda::GradWeightGemmArgs;
using cuda::GradWeightKernel;

// The grad_W kernels and the ping-pong one's three ways of taking tiles:
// fixed (every gridDim-th tile), to whichever CTA asks next, or fixed in
// CTA pairs sharing D^T.
struct GradWeightVariant {
  GradWeightKernel kernel;
  bool counted;
  bool pairs;
  const char* name;
};
constexpr GradWeightVariant kGradWeightVariants[] = {
    {GradWeightKernel::kPingPong, false, false, "ping-pong"},
    {GradWeightKernel::kPingPong, true, false, "ping-pong, counted tiles"},
    {GradWeightKernel::kPingPong, false, true, "ping-pong, CTA pairs"},
    {GradWeightKernel::kCooperative, false, false, "cooperative"}};

GradInputGemmArgs InputArgs(const void* d, const void* w, const Shape& s, float* out, int splits) {
  GradInputGemmArgs a;
  a.d = d;
  a.w = w;
  a.rows = s.rows;
  a.cols = s.cols;
  a.hidden = s.hidden;
  a.out = out;
  a.splits = splits;
  return a;
}

GradWeightGemmArgs WeightArgs(const void* d, const void* x, const Shape& s, float* gw,
                              GradWeightKernel kernel = GradWeightKernel::kPingPong) {
  GradWeightGemmArgs a;
  a.kernel = kernel;
  a.d = d;
  a.x = x;
  a.rows = s.rows;
  a.cols = s.cols;
  a.hidden = s.hidden;
  a.gw = gw;
  return a;
}

class BackwardGemmTest : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override {
    SKIP_WITHOUT_CUDA_DEVICE();
    if (!BackwardGemmSupported(GetParam(), 64)) {
      GTEST_SKIP() << "the own backward GEMMs need compute capability 9.0 (Hopper)";
    }
    ASSERT_EQ(cudaMalloc(&counter_, sizeof(int32_t)), cudaSuccess);
  }
  void TearDown() override {
    if (counter_ != nullptr) cudaFree(counter_);
  }
  // Arguments for `v`, with its tile counter zeroed where it counts tiles.
  GradWeightGemmArgs VariantArgs(const GradWeightVariant& v, const void* d, const void* x,
                                 const Shape& s, float* gw) {
    GradWeightGemmArgs a = WeightArgs(d, x, s, gw, v.kernel);
    a.cta_pairs = v.pairs;
    if (v.counted) {
      EXPECT_EQ(cudaMemset(counter_, 0, sizeof(int32_t)), cudaSuccess);
      a.tile_counter = counter_;
    }
    return a;
  }
  int32_t* counter_ = nullptr;
};

const Shape kShapes[] = {{300, 2048 + 128, 136}, {5, 384, 264}, {1000, 1024, 520}, {129, 256, 8}};

TEST_P(BackwardGemmTest, GradInputMatchesFloat64ForEverySplit) {
  const DType dtype = GetParam();
  std::mt19937 rng(7);
  for (const Shape& s : kShapes) {
    const std::vector<float> d = RandomRounded(dtype, s.rows * s.cols, 1.0f, &rng);
    const std::vector<float> w = RandomRounded(dtype, s.cols * s.hidden, 0.5f, &rng);
    const Expected expected = Float64Products(d, w, s, /*weight=*/false, {});
    void* d_dev = Upload16(dtype, d);
    void* w_dev = Upload16(dtype, w);
    for (int splits : {1, 2, 3, 4}) {
      SCOPED_TRACE(::testing::Message() << "rows " << s.rows << " cols " << s.cols << " hidden "
                                        << s.hidden << " splits " << splits);
      const size_t slab = static_cast<size_t>(s.rows * s.hidden);
      float* out = nullptr;
      ASSERT_EQ(cudaMalloc(&out, slab * splits * sizeof(float)), cudaSuccess);
      ASSERT_EQ(cudaMemset(out, 0xFF, slab * splits * sizeof(float)), cudaSuccess);  // NaN
      ASSERT_TRUE(cuda::LaunchGradInputGemm(dtype, InputArgs(d_dev, w_dev, s, out, splits), nullptr,
                                            nullptr)
                      .ok());
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const std::vector<float> slabs = Download(out, slab * splits);
      std::vector<float> sum(slab, 0.0f);
      for (int p = 0; p < splits; ++p) {
        for (size_t i = 0; i < slab; ++i) sum[i] += slabs[p * slab + i];
      }
      ExpectClose(expected.value, expected.abs_sum, sum, "grad_input");
      cudaFree(out);
    }
    cudaFree(d_dev);
    cudaFree(w_dev);
  }
}

// Beyond kShapes (vocabulary rows 2176, 384, 1024, 256: the ping-pong
// kernel's 192-row tiles end inside the last or fit exactly), more tiles
// than two per SM, so that each consumer warpgroup takes several turns.
const Shape kWeightShapes[] = {{130, 8320, 1024}, {70, 40064, 264}};

TEST_P(BackwardGemmTest, GradWeightAddsFloat64ProductOntoExistingValues) {
  const DType dtype = GetParam();
  std::mt19937 rng(11);
  std::vector<Shape> shapes(std::begin(kShapes), std::end(kShapes));
  shapes.insert(shapes.end(), std::begin(kWeightShapes), std::end(kWeightShapes));
  for (const Shape& s : shapes) {
    const std::vector<float> d = RandomRounded(dtype, s.rows * s.cols, 1.0f, &rng);
    const std::vector<float> x = RandomRounded(dtype, s.rows * s.hidden, 0.5f, &rng);
    std::vector<float> gw0(static_cast<size_t>(s.cols * s.hidden));
    std::uniform_real_distribution<float> uni(-3.0f, 3.0f);
    for (float& g : gw0) g = uni(rng);
    const Expected expected = Float64Products(d, x, s, /*weight=*/true, gw0);
    void* d_dev = Upload16(dtype, d);
    void* x_dev = Upload16(dtype, x);
    for (const GradWeightVariant& v : kGradWeightVariants) {
      SCOPED_TRACE(::testing::Message() << v.name << ", rows " << s.rows << " cols " << s.cols
                                        << " hidden " << s.hidden);
      float* gw = Upload(gw0);
      ASSERT_TRUE(
          cuda::LaunchGradWeightGemm(dtype, VariantArgs(v, d_dev, x_dev, s, gw), nullptr, nullptr)
              .ok());
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      ExpectClose(expected.value, expected.abs_sum, Download(gw, gw0.size()), "grad_W");
      cudaFree(gw);
    }
    cudaFree(d_dev);
    cudaFree(x_dev);
  }
}

TEST_P(BackwardGemmTest, RepeatedRunsAreBitwiseIdentical) {
  const DType dtype = GetParam();
  std::mt19937 rng(3);
  const Shape s{700, 4096, 264};
  void* d_dev = Upload16(dtype, RandomRounded(dtype, s.rows * s.cols, 1.0f, &rng));
  void* w_dev = Upload16(dtype, RandomRounded(dtype, s.cols * s.hidden, 0.5f, &rng));
  std::vector<float> first;
  for (int run = 0; run < 3; ++run) {
    float* out = nullptr;
    ASSERT_EQ(cudaMalloc(&out, s.rows * s.hidden * 3 * sizeof(float)), cudaSuccess);
    ASSERT_TRUE(
        cuda::LaunchGradInputGemm(dtype, InputArgs(d_dev, w_dev, s, out, 3), nullptr, nullptr)
            .ok());
    std::vector<float> all = Download(out, static_cast<size_t>(s.rows * s.hidden * 3));
    for (const GradWeightVariant& v : kGradWeightVariants) {
      float* gw = nullptr;
      ASSERT_EQ(cudaMalloc(&gw, s.cols * s.hidden * sizeof(float)), cudaSuccess);
      ASSERT_EQ(cudaMemset(gw, 0, s.cols * s.hidden * sizeof(float)), cudaSuccess);
      // X: any rows x hidden matrix will do, here the first `rows` rows of W.
      ASSERT_TRUE(
          cuda::LaunchGradWeightGemm(dtype, VariantArgs(v, d_dev, w_dev, s, gw), nullptr, nullptr)
              .ok());
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const std::vector<float> gw_host = Download(gw, static_cast<size_t>(s.cols * s.hidden));
      all.insert(all.end(), gw_host.begin(), gw_host.end());
      cudaFree(gw);
    }
    if (run == 0) {
      first = all;
    } else {
      EXPECT_EQ(std::memcmp(first.data(), all.data(), first.size() * sizeof(float)), 0)
          << "run " << run << " differs from the first";
    }
    cudaFree(out);
  }
  cudaFree(d_dev);
  cudaFree(w_dev);
}

// grad_W launched beside grad_input (programmatic dependent launch, tiles
// counted) on one stream, as the row-scaled plan runs them, with a third
// kernel after both that reads grad_input: every output against float64,
// bitwise equal to the two GEMMs run one after the other. grad_input has
// more tiles than SMs (a last wave part full) so grad_W's CTAs start while
// some of its CTAs still run.
TEST_P(BackwardGemmTest, GradWeightBesideGradInputMatchesBothAlone) {
  const DType dtype = GetParam();
  std::mt19937 rng(5);
  const Shape s{1100, 384, 4000};  // 9 x 16 = 144 grad_input tiles of 128 x 256
  const std::vector<float> d = RandomRounded(dtype, s.rows * s.cols, 1.0f, &rng);
  const std::vector<float> w = RandomRounded(dtype, s.cols * s.hidden, 0.5f, &rng);
  const std::vector<float> x = RandomRounded(dtype, s.rows * s.hidden, 0.5f, &rng);
  std::vector<float> gw0(static_cast<size_t>(s.cols * s.hidden));
  std::uniform_real_distribution<float> uni(-3.0f, 3.0f);
  for (float& g : gw0) g = uni(rng);
  const Expected gi_expected = Float64Products(d, w, s, /*weight=*/false, {});
  const Expected gw_expected = Float64Products(d, x, s, /*weight=*/true, gw0);
  void* d_dev = Upload16(dtype, d);
  void* w_dev = Upload16(dtype, w);
  void* x_dev = Upload16(dtype, x);
  const size_t gi_n = static_cast<size_t>(s.rows * s.hidden);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  std::vector<float> results[2];
  for (bool beside : {false, true}) {
    SCOPED_TRACE(beside ? "beside" : "one after the other");
    float* gi = nullptr;
    float* gi_copy = nullptr;
    ASSERT_EQ(cudaMalloc(&gi, gi_n * sizeof(float)), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&gi_copy, gi_n * sizeof(float)), cudaSuccess);
    ASSERT_EQ(cudaMemset(gi, 0xFF, gi_n * sizeof(float)), cudaSuccess);  // NaN
    ASSERT_EQ(cudaMemset(gi_copy, 0xFF, gi_n * sizeof(float)), cudaSuccess);
    float* gw = Upload(gw0);
    ASSERT_EQ(cudaMemsetAsync(counter_, 0, sizeof(int32_t), stream), cudaSuccess);
    ASSERT_TRUE(
        cuda::LaunchGradInputGemm(dtype, InputArgs(d_dev, w_dev, s, gi, 1), stream, nullptr).ok());
    GradWeightGemmArgs a = WeightArgs(d_dev, x_dev, s, gw);
    a.tile_counter = counter_;
    a.beside_grad_input = beside;
    ASSERT_TRUE(cuda::LaunchGradWeightGemm(dtype, a, stream, nullptr).ok());
    // Stream order after grad_W must cover grad_input too.
    ASSERT_EQ(cudaMemcpyAsync(gi_copy, gi, gi_n * sizeof(float), cudaMemcpyDeviceToDevice, stream),
              cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    const std::vector<float> gi_host = Download(gi_copy, gi_n);
    const std::vector<float> gw_host = Download(gw, gw0.size());
    ExpectClose(gi_expected.value, gi_expected.abs_sum, gi_host, "grad_input");
    ExpectClose(gw_expected.value, gw_expected.abs_sum, gw_host, "grad_W");
    results[beside] = gi_host;
    results[beside].insert(results[beside].end(), gw_host.begin(), gw_host.end());
    cudaFree(gi);
    cudaFree(gi_copy);
    cudaFree(gw);
  }
  EXPECT_EQ(std::memcmp(results[0].data(), results[1].data(), results[0].size() * sizeof(float)),
            0);
  cudaStreamDestroy(stream);
  cudaFree(d_dev);
  cudaFree(w_dev);
  cudaFree(x_dev);
}

// What only the ping-pong kernel takes is refused elsewhere, and beside
// grad_input needs the counter; checked before any launch (runs everywhere).
TEST(GradWeightArgsTest, RefusesOverlapWithoutItsCounterOrKernel) {
  GradWeightGemmArgs a;
  a.d = reinterpret_cast<const void*>(uintptr_t{256});
  a.x = a.d;
  a.rows = 64;
  a.cols = 128;
  a.hidden = 128;
  a.gw = reinterpret_cast<float*>(uintptr_t{256});
  a.beside_grad_input = true;
  absl::Status st = cuda::LaunchGradWeightGemm(DType::kBF16, a, nullptr, nullptr);
  EXPECT_EQ(st.code(), absl::StatusCode::kInternal);
  EXPECT_NE(st.message().find("tile counter"), std::string::npos) << st.message();
  a.beside_grad_input = false;
  a.kernel = GradWeightKernel::kCooperative;
  a.tile_counter = reinterpret_cast<int32_t*>(uintptr_t{256});
  st = cuda::LaunchGradWeightGemm(DType::kBF16, a, nullptr, nullptr);
  EXPECT_EQ(st.code(), absl::StatusCode::kInternal);
  EXPECT_NE(st.message().find("ping-pong"), std::string::npos) << st.message();
  // CTA pairs go through their tiles in a fixed order, never counted ones.
  a.kernel = GradWeightKernel::kPingPong;
  a.cta_pairs = true;
  st = cuda::LaunchGradWeightGemm(DType::kBF16, a, nullptr, nullptr);
  EXPECT_EQ(st.code(), absl::StatusCode::kInternal);
  EXPECT_NE(st.message().find("static tiles"), std::string::npos) << st.message();
}

// Where the default takes the own grad_input kernel: where splits fill the
// waves, or, up to H = 2048, where grad_W runs beside it; chunks of 2048
// tokens and more. Host logic, runs everywhere.
TEST(GradInputDefaultTest, OwnKernelWhereItsWavesAreFilled) {
  EXPECT_TRUE(cuda::OwnGradInputByDefault(5632, 1024, 3, false));  // first bench shape
  EXPECT_TRUE(cuda::OwnGradInputByDefault(6554, 2048, 1, true));   // grad_W beside it
  EXPECT_TRUE(cuda::OwnGradInputByDefault(5462, 1536, 1, true));
  EXPECT_FALSE(cuda::OwnGradInputByDefault(6554, 2048, 1, false));  // one split alone: cuBLAS
  EXPECT_FALSE(cuda::OwnGradInputByDefault(5462, 4096, 1, true));   // cuBLAS ahead at H = 4096
  EXPECT_TRUE(cuda::OwnGradInputByDefault(5462, 4096, 2, true));
  EXPECT_FALSE(cuda::OwnGradInputByDefault(2047, 1024, 3, true));
}

// Where the default takes the own (ping-pong) grad_W kernel: chunks of 2048
// tokens and more at 1536 <= H <= 2048, beside the own grad_input. Host
// logic, runs everywhere.
TEST(GradWeightDefaultTest, OwnKernelForLargeChunksOfWideHeads) {
  EXPECT_TRUE(cuda::OwnGradWeightByDefault(6554, 2048));
  EXPECT_TRUE(cuda::OwnGradWeightByDefault(2048, 1536));
  EXPECT_FALSE(cuda::OwnGradWeightByDefault(5632, 3072));  // cuBLAS's 128 x 160 tile ahead
  EXPECT_FALSE(cuda::OwnGradWeightByDefault(5632, 4096));
  EXPECT_FALSE(cuda::OwnGradWeightByDefault(8192, 8192));
  EXPECT_FALSE(cuda::OwnGradWeightByDefault(5632, 1024));  // cuBLAS ahead at H = 1024
  EXPECT_FALSE(cuda::OwnGradWeightByDefault(2047, 4096));
  EXPECT_FALSE(cuda::OwnGradWeightByDefault(8, 4096));  // the thin streaming pass
}

// The split count decides where the vocabulary is cut; host logic, runs
// everywhere. An H200 has 132 SMs.
TEST(GradInputSplitsTest, FillsTheLastWaveWithinTheRoomGiven) {
  // Seed shape chunk: 44 x 4 = 176 tiles (1.33 waves); three splits make 528 = 4 waves.
  EXPECT_EQ(cuda::GradInputSplits(5632, 1024, 176256, 4, 132), 3);
  // Without room for extra slabs there is one split, whatever the waves.
  EXPECT_EQ(cuda::GradInputSplits(5632, 1024, 176256, 1, 132), 1);
  EXPECT_EQ(cuda::GradInputSplits(5632, 1024, 176256, 0, 132), 1);
  // Already 99% full (1440 tiles on 132 SMs is 10.9 waves): no split.
  EXPECT_EQ(cuda::GradInputSplits(11520, 4096, 151936, 4, 132), 1);
  // A single 64-column block of K cannot be split.
  EXPECT_EQ(cuda::GradInputSplits(300, 136, 64, 4, 132), 1);
  // One tile: every split fills more; the most the room allows.
  EXPECT_EQ(cuda::GradInputSplits(100, 200, 20096, 4, 132), 4);
  for (int room = 1; room <= 4; ++room) {
    for (int64_t rows : {1, 700, 2048, 6144, 65535}) {
      const int s = cuda::GradInputSplits(rows, 896, 151936, room, 132);
      EXPECT_GE(s, 1);
      EXPECT_LE(s, room);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, BackwardGemmTest, ::testing::Values(DType::kBF16, DType::kF16),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(DTypeName(info.param));
                         });

}  // namespace
}  // namespace flce::test
