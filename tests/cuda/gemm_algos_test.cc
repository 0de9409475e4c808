// grad_W on cuBLAS's algorithm of a preferred tile (kernels/cuda/gemm_algos.h):
// Gemm::GradWeight onto random fp32 values at chunks of 2048 tokens and more
// (odd row counts, H off the tiles), with every tile cublasLt names preferred
// so that the cublasLt path runs whatever the heuristic offers at these sizes,
// against a float64 product of the same 16-bit inputs and bit for bit against
// a repeat; on Hopper, the default preference's tile at the bench's first
// shape. The tile list's parsing runs without a GPU.
#include "kernels/cuda/gemm_algos.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/gemm.h"
#include "kernels/dtype.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/cuda/product_test_util.h"

namespace flce::test {
namespace {

using cuda::GemmAlgos;
using cuda::PreferredGemmTiles;

TEST(PreferredGemmTilesTest, OffByDefaultAndListsAsSpelled) {
  auto unset = PreferredGemmTiles(nullptr);
  ASSERT_TRUE(unset.ok());
  EXPECT_TRUE(unset->empty());
  auto measured = PreferredGemmTiles("128x128,128x160");
  ASSERT_TRUE(measured.ok());
  EXPECT_EQ(*measured, (std::vector<cublasLtMatmulTile_t>{CUBLASLT_MATMUL_TILE_128x128,
                                                          CUBLASLT_MATMUL_TILE_128x160}));
  auto off = PreferredGemmTiles("cublas");
  ASSERT_TRUE(off.ok());
  EXPECT_TRUE(off->empty());
  auto listed = PreferredGemmTiles("128x160,256x128");
  ASSERT_TRUE(listed.ok());
  EXPECT_EQ(*listed, (std::vector<cublasLtMatmulTile_t>{CUBLASLT_MATMUL_TILE_128x160,
                                                        CUBLASLT_MATMUL_TILE_256x128}));
}

TEST(PreferredGemmTilesTest, UnknownTileIsRefusedByName) {
  auto bad = PreferredGemmTiles("128x128,huge");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("'huge'"), std::string::npos) << bad.status();
  EXPECT_NE(bad.status().message().find("FLCE_CUDA_GEMM_TILES"), std::string::npos);
}

struct Case {
  DType dtype;
  Shape shape;
};

constexpr const char* kEveryTile =
    "128x128,128x160,128x192,128x256,192x128,192x192,256x64,256x128,320x128,64x128,64x256,128x64";

class GemmAlgosTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    SKIP_WITHOUT_CUDA_DEVICE();
    setenv("FLCE_CUDA_GEMM_TILES", kEveryTile, 1);
    auto algos = GemmAlgos::Create();
    ASSERT_TRUE(algos.ok()) << algos.status();
    algos_ = std::move(*algos);
    ASSERT_EQ(cublasCreate(&blas_), CUBLAS_STATUS_SUCCESS);
    gemm_.handle = blas_;
    gemm_.dtype = GetParam().dtype;
    gemm_.algos = algos_.get();
  }
  void TearDown() override {
    unsetenv("FLCE_CUDA_GEMM_TILES");
    if (blas_ != nullptr) cublasDestroy(blas_);
  }
  std::unique_ptr<GemmAlgos> algos_;
  cublasHandle_t blas_ = nullptr;
  cuda::Gemm gemm_;
};

// The cublasLt path must be what ran: with every tile preferred, any
// algorithm cublasLt offers is taken.
void ExpectPreferredTile(GemmAlgos* algos, const cuda::LtProduct& p, const char* what) {
  const auto tile = algos->TileFor(p, nullptr);
  ASSERT_TRUE(tile.ok()) << tile.status();
  ASSERT_TRUE(tile->has_value()) << what << ": cublasLt offered no algorithm";
  std::printf("  %s: cublasLt tile id %d\n", what, static_cast<int>(**tile));
}

TEST_P(GemmAlgosTest, GradWeightAddsFloat64ProductAndRepeatsBitwise) {
  const DType dtype = GetParam().dtype;
  const Shape s = GetParam().shape;
  std::mt19937 rng(static_cast<uint32_t>(std::random_device{}()));
  const auto d = RandomRounded(dtype, s.rows * s.cols, 0.05f, &rng);
  const auto x = RandomRounded(dtype, s.rows * s.hidden, 1.0f, &rng);
  const auto gw0 = RandomRounded(DType::kF32, s.cols * s.hidden, 1.0f, &rng);
  void* dev_d = Upload16(dtype, d);
  void* dev_x = Upload16(dtype, x);
  float* gw = Upload(gw0);
  std::vector<float> runs[2];
  for (auto& got : runs) {
    ASSERT_EQ(cudaMemcpy(gw, gw0.data(), gw0.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_TRUE(gemm_.GradWeight(dev_d, s.cols, dev_x, s.rows, s.cols, s.hidden, gw).ok());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    got = Download(gw, gw0.size());
  }
  const Expected expected = Float64Products(d, x, s, /*weight=*/true, gw0);
  ExpectClose(expected.value, expected.abs_sum, runs[0], "grad_W");
  EXPECT_EQ(std::memcmp(runs[0].data(), runs[1].data(), runs[0].size() * 4), 0)
      << "grad_W differs between two identical runs";
  ExpectPreferredTile(algos_.get(),
                      cuda::GradWeightProduct(dtype, s.cols, s.rows, s.cols, s.hidden), "grad_W");
  cudaFree(dev_d);
  cudaFree(dev_x);
  cudaFree(gw);
}

// Rows off every tile (2053 = 16 x 128 + 5), the vocabulary padded to 64 as
// the plans pad it, H = 264 off the 128/160-wide tiles, and H = 1024.
INSTANTIATE_TEST_SUITE_P(Shapes, GemmAlgosTest,
                         ::testing::Values(Case{DType::kBF16, {2053, 1088, 264}},
                                           Case{DType::kF16, {2048, 1024, 136}},
                                           Case{DType::kBF16, {2304, 576, 1024}}));

// Where the preference was measured (docs/perf/cuda.md step 45): the H200's
// cuBLAS offers one of the measured tiles for grad_W at the bench's first shape
// (5632-token chunks, H = 1024, V = 176256), so the cublasLt path is what runs
// there when FLCE_CUDA_GEMM_TILES names them.
TEST(GemmAlgosOnHopperTest, PreferredTileForGradWeightAtTheFirstBenchShape) {
  SKIP_WITHOUT_CUDA_DEVICE();
  int major = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0), cudaSuccess);
  if (major != 9) GTEST_SKIP() << "the preference was measured on Hopper (compute capability 9.0)";
  setenv("FLCE_CUDA_GEMM_TILES", "128x128,128x160", 1);
  auto algos = GemmAlgos::Create();
  ASSERT_TRUE(algos.ok()) << algos.status();
  // 5632-token chunk, H = 1024, V = 176256 (its padded vocabulary).
  const cuda::LtProduct grad_weight =
      cuda::GradWeightProduct(DType::kBF16, 176256, 5632, 176256, 1024);
  auto tile = (*algos)->TileFor(grad_weight, nullptr);
  ASSERT_TRUE(tile.ok()) << tile.status();
  ASSERT_TRUE(tile->has_value()) << "no preferred tile offered";
  EXPECT_TRUE(**tile == CUBLASLT_MATMUL_TILE_128x128 || **tile == CUBLASLT_MATMUL_TILE_128x160)
      << static_cast<int>(**tile);
  unsetenv("FLCE_CUDA_GEMM_TILES");
}

}  // namespace
}  // namespace flce::test
