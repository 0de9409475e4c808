// grad_W on cuBLAS's algorithm of a preferred tile (kernels/cuda/ops/gemm_algos.h):
// Gemm::GradWeight onto random fp32 values at chunks of 2048 tokens and more
// (odd row counts, H off the tiles), with every tile flce names preferred so
// that the cublasLt path runs wherever the heuristic offers one of them,
// against a float64 product of the same 16-bit inputs and bit for bit against
// a repeat. For bf16 at H = 1024 and 2304 tokens the H200's cuBLAS offers one
// (the cases say where the cublasLt path must have run); for the other cases
// (small H; 2053 fp16 tokens at H = 1024) it offered none of the named tiles
// and cublasGemmEx ran, which the same checks cover. On Hopper, the default
// preference's tile at the bench's shapes, and the default above H = 2048
// (128 x 160) at a chunk of the second shape's kind. The tile list's parsing and
// where grad_W asks for a tile run without a GPU.
#include "kernels/cuda/ops/gemm_algos.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "absl/status/status.h"
#include "core/dtype.h"
#include "gtest/gtest.h"
#include "kernels/cuda/ops/gemm.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/cuda/product_test_util.h"

namespace flce::test {
namespace {

using cuda::GemmAlgos;
using cuda::PreferredGemmTiles;

TEST(PreferredGemmTilesTest, MeasuredTileByDefaultAndListsAsSpelled) {
  auto unset = PreferredGemmTiles(nullptr, 1024);
  ASSERT_TRUE(unset.ok());
  EXPECT_EQ(*unset, (std::vector<cublasLtMatmulTile_t>{CUBLASLT_MATMUL_TILE_128x128}));
  auto empty = PreferredGemmTiles("", 1024);  // set to nothing reads as unset
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(*empty, *unset);
  auto measured = PreferredGemmTiles("128x128,128x160", 1024);
  ASSERT_TRUE(measured.ok());
  EXPECT_EQ(*measured, (std::vector<cublasLtMatmulTile_t>{CUBLASLT_MATMUL_TILE_128x128,
                                                          CUBLASLT_MATMUL_TILE_128x160}));
  auto off = PreferredGemmTiles("cublas", 1024);
  ASSERT_TRUE(off.ok());
  EXPECT_TRUE(off->empty());
  auto listed = PreferredGemmTiles("128x160,256x128", 1024);
  ASSERT_TRUE(listed.ok());
  EXPECT_EQ(*listed, (std::vector<cublasLtMatmulTile_t>{CUBLASLT_MATMUL_TILE_128x160,
                                                        CUBLASLT_MATMUL_TILE_256x128}));
}

TEST(PreferredGemmTilesTest, DefaultByHiddenAndASetListAtEveryHidden) {
  const std::vector<cublasLtMatmulTile_t> narrow{CUBLASLT_MATMUL_TILE_128x128};
  const std::vector<cublasLtMatmulTile_t> wide{CUBLASLT_MATMUL_TILE_128x160};
  for (const int64_t hidden : {1024, 1536, 2048}) {
    auto tiles = PreferredGemmTiles(nullptr, hidden);
    ASSERT_TRUE(tiles.ok());
    EXPECT_EQ(*tiles, narrow) << "H = " << hidden;
  }
  for (const int64_t hidden : {2056, 3072, 4096, 8192}) {
    auto tiles = PreferredGemmTiles("", hidden);
    ASSERT_TRUE(tiles.ok());
    EXPECT_EQ(*tiles, wide) << "H = " << hidden;
  }
  auto set = PreferredGemmTiles("128x128", 4096);
  ASSERT_TRUE(set.ok());
  EXPECT_EQ(*set, narrow);
  auto off = PreferredGemmTiles("cublas", 8192);
  ASSERT_TRUE(off.ok());
  EXPECT_TRUE(off->empty());
}

TEST(PreferTileForGradWeightTest, DefaultFromH1024AndASetListAtEveryH) {
  using cuda::PreferTileForGradWeight;
  EXPECT_TRUE(PreferTileForGradWeight(5632, 1024, nullptr));  // the bench's first shape
  EXPECT_TRUE(PreferTileForGradWeight(2048, 1408, nullptr));
  EXPECT_TRUE(PreferTileForGradWeight(5632, 4096, nullptr));  // the second and third shapes
  EXPECT_TRUE(PreferTileForGradWeight(4096, 4096, nullptr));
  EXPECT_FALSE(PreferTileForGradWeight(2047, 1024, nullptr));  // below 2048 tokens
  EXPECT_FALSE(PreferTileForGradWeight(6144, 896, nullptr));   // measured mixed below H = 1024
  EXPECT_FALSE(PreferTileForGradWeight(6144, 512, nullptr));
  EXPECT_FALSE(PreferTileForGradWeight(6144, 512, ""));  // as unset
  EXPECT_TRUE(PreferTileForGradWeight(5632, 1024, ""));
  EXPECT_TRUE(PreferTileForGradWeight(6144, 512, "128x128"));
  EXPECT_TRUE(PreferTileForGradWeight(2048, 136, "128x160,128x128"));
  EXPECT_FALSE(PreferTileForGradWeight(2047, 136, "128x128"));
  EXPECT_FALSE(PreferTileForGradWeight(5632, 1024, "cublas"));
}

TEST(PreferredGemmTilesTest, MeasuredNamesNoListAndAppliesAtEveryHidden) {
  auto measured = PreferredGemmTiles("measured", 4096);
  ASSERT_TRUE(measured.ok()) << measured.status();
  EXPECT_TRUE(measured->empty());
  EXPECT_TRUE(cuda::MeasuredGemmTiles("measured"));
  EXPECT_FALSE(cuda::MeasuredGemmTiles(nullptr));
  EXPECT_FALSE(cuda::MeasuredGemmTiles(""));
  EXPECT_FALSE(cuda::MeasuredGemmTiles("128x160"));
  EXPECT_TRUE(cuda::PreferTileForGradWeight(2048, 512, "measured"));
  EXPECT_FALSE(cuda::PreferTileForGradWeight(2047, 4096, "measured"));
}

TEST(PreferredGemmTilesTest, UnknownTileIsRefusedByName) {
  auto bad = PreferredGemmTiles("128x128,huge", 1024);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("'huge'"), std::string::npos) << bad.status();
  EXPECT_NE(bad.status().message().find("FLCE_CUDA_GEMM_TILES"), std::string::npos);
}

struct Case {
  DType dtype;
  Shape shape;
  bool lt_on_hopper;  // the H200's cuBLAS offers a named tile: the cublasLt path must run
};

constexpr const char* kEveryTile =
    "128x128,128x160,128x192,128x256,192x128,192x192,256x64,256x128,320x128,64x128,64x256,128x64";

class GemmAlgosTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    SKIP_WITHOUT_CUDA_DEVICE();
    auto algos = GemmAlgos::Create();
    ASSERT_TRUE(algos.ok()) << algos.status();
    algos_ = std::move(*algos);
    ASSERT_EQ(cublasCreate(&blas_), CUBLAS_STATUS_SUCCESS);
    every_tile_.gemm_tiles = kEveryTile;
    gemm_.handle = blas_;
    gemm_.dtype = GetParam().dtype;
    gemm_.algos = algos_.get();
    gemm_.switches = &every_tile_;
  }
  void TearDown() override {
    if (blas_ != nullptr) cublasDestroy(blas_);
  }
  std::unique_ptr<GemmAlgos> algos_;
  cublasHandle_t blas_ = nullptr;
  cuda::KernelSwitches every_tile_;  // FLCE_CUDA_GEMM_TILES = kEveryTile
  cuda::Gemm gemm_;
};

bool OnHopper() {
  int major = 0;
  return cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) == cudaSuccess &&
         major == 9;
}

// Which path ran: with every named tile preferred, any such algorithm cublasLt
// offers is taken; where the case says so, on Hopper it must have been.
void ExpectPathTaken(GemmAlgos* algos, const cuda::LtProduct& p, bool lt_required,
                     const char* what) {
  const auto tile = algos->TileFor(p, kEveryTile, nullptr);
  ASSERT_TRUE(tile.ok()) << tile.status();
  if (lt_required) {
    ASSERT_TRUE(tile->has_value()) << what << ": cublasLt offered none of the named tiles";
  }
  if (tile->has_value()) {
    std::printf("  %s: cublasLt tile id %d\n", what, static_cast<int>(**tile));
  } else {
    std::printf("  %s: no named tile offered, cublasGemmEx ran\n", what);
  }
}

// Random 16-bit operands of grad_W on the GPU and the fp32 values it adds onto.
struct GradWeightOperands {
  std::vector<float> d, x, gw0;
  void* dev_d = nullptr;
  void* dev_x = nullptr;
  float* gw = nullptr;
  GradWeightOperands(DType dtype, const Shape& s, std::mt19937* rng)
      : d(RandomRounded(dtype, s.rows * s.cols, 0.05f, rng)),
        x(RandomRounded(dtype, s.rows * s.hidden, 1.0f, rng)),
        gw0(RandomRounded(DType::kF32, s.cols * s.hidden, 1.0f, rng)),
        dev_d(Upload16(dtype, d)),
        dev_x(Upload16(dtype, x)),
        gw(Upload(gw0)) {}
  ~GradWeightOperands() {
    cudaFree(dev_d);
    cudaFree(dev_x);
    cudaFree(gw);
  }
  GradWeightOperands(const GradWeightOperands&) = delete;
  GradWeightOperands& operator=(const GradWeightOperands&) = delete;

  // gw0 + D^T X through `gemm`, downloaded; empty where a step failed.
  std::vector<float> Run(const cuda::Gemm& gemm, const Shape& s) {
    if (cudaMemcpy(gw, gw0.data(), gw0.size() * 4, cudaMemcpyHostToDevice) != cudaSuccess) {
      ADD_FAILURE() << "upload of grad_W's initial values";
      return {};
    }
    const absl::Status st = gemm.GradWeight(dev_d, s.cols, dev_x, s.rows, s.cols, s.hidden, gw);
    if (!st.ok()) {
      ADD_FAILURE() << "grad_W: " << st;
      return {};
    }
    if (const cudaError_t err = cudaDeviceSynchronize(); err != cudaSuccess) {
      ADD_FAILURE() << "grad_W: " << cudaGetErrorString(err);
      return {};
    }
    return Download(gw, gw0.size());
  }
};

TEST_P(GemmAlgosTest, GradWeightAddsFloat64ProductAndRepeatsBitwise) {
  const DType dtype = GetParam().dtype;
  const Shape s = GetParam().shape;
  std::mt19937 rng(static_cast<uint32_t>(std::random_device{}()));
  GradWeightOperands op(dtype, s, &rng);
  std::vector<float> runs[2];
  for (auto& got : runs) {
    got = op.Run(gemm_, s);
    ASSERT_EQ(got.size(), op.gw0.size());
  }
  const Expected expected = Float64Products(op.d, op.x, s, /*weight=*/true, op.gw0);
  ExpectClose(expected.value, expected.abs_sum, runs[0], "grad_W");
  EXPECT_EQ(std::memcmp(runs[0].data(), runs[1].data(), runs[0].size() * 4), 0)
      << "grad_W differs between two identical runs";
  ExpectPathTaken(algos_.get(), cuda::GradWeightProduct(dtype, s.cols, s.rows, s.cols, s.hidden),
                  GetParam().lt_on_hopper && OnHopper(), "grad_W");
}

// Rows off every tile (2053 = 16 x 128 + 5), the vocabulary padded to 64 as
// the plans pad it, H = 264 and 1000 off the 128-wide tiles, and H = 1024.
INSTANTIATE_TEST_SUITE_P(Shapes, GemmAlgosTest,
                         ::testing::Values(Case{DType::kBF16, {2053, 1088, 264}, false},
                                           Case{DType::kF16, {2048, 1024, 136}, false},
                                           Case{DType::kBF16, {2053, 1088, 1000}, false},
                                           Case{DType::kF16, {2053, 1088, 1024}, false},
                                           Case{DType::kBF16, {2304, 576, 1024}, true}));

// FLCE_CUDA_GEMM_TILES=measured: each of the trial's runs adds the product on
// one of the heuristic's candidates (every one within the float64 bound), and
// once the trial is decided its winner runs every time (repeats bitwise equal).
TEST(GemmAlgosMeasuredTest, EveryCandidateAddsTheProductAndTheWinnerRepeats) {
  SKIP_WITHOUT_CUDA_DEVICE();
  auto algos = GemmAlgos::Create();
  ASSERT_TRUE(algos.ok()) << algos.status();
  cublasHandle_t blas = nullptr;
  ASSERT_EQ(cublasCreate(&blas), CUBLAS_STATUS_SUCCESS);
  cuda::KernelSwitches measured;
  measured.gemm_tiles = "measured";
  cuda::Gemm gemm;
  gemm.handle = blas;
  gemm.dtype = DType::kBF16;
  gemm.algos = algos->get();
  gemm.switches = &measured;
  const Shape s{2053, 1088, 1000};  // rows off every tile, H off the 128-wide ones
  EXPECT_EQ(gemm.GradWeightPathFor(s.rows, s.hidden), cuda::Gemm::GradWeightPath::kMeasured);
  std::mt19937 rng(static_cast<uint32_t>(std::random_device{}()));
  GradWeightOperands op(gemm.dtype, s, &rng);
  const Expected expected = Float64Products(op.d, op.x, s, /*weight=*/true, op.gw0);
  for (int run = 0; run < cuda::kMeasuredCandidates * cuda::kMeasuredSamples; ++run) {
    const std::vector<float> got = op.Run(gemm, s);
    ASSERT_EQ(got.size(), op.gw0.size());
    ExpectClose(expected.value, expected.abs_sum, got, "grad_W, a trial's run");
  }
  const std::vector<float> first = op.Run(gemm, s);
  const std::vector<float> second = op.Run(gemm, s);
  ASSERT_EQ(first.size(), op.gw0.size());
  ASSERT_EQ(second.size(), op.gw0.size());
  ExpectClose(expected.value, expected.abs_sum, first, "grad_W on the winner");
  EXPECT_EQ(std::memcmp(first.data(), second.data(), first.size() * 4), 0)
      << "grad_W differs between two runs after the trial";
  cublasDestroy(blas);
}

// Where the preference was measured (docs/perf/cuda.md steps 45-46): with
// FLCE_CUDA_GEMM_TILES unset, the H200's cuBLAS offers the default 128 x 128
// tile for grad_W at the bench's first shape, so the cublasLt path is what runs
// there by default.
TEST(GemmAlgosOnHopperTest, DefaultTileForGradWeightAtTheFirstBenchShape) {
  SKIP_WITHOUT_CUDA_DEVICE();
  if (!OnHopper()) GTEST_SKIP() << "the preference was measured on Hopper (compute capability 9.0)";
  auto algos = GemmAlgos::Create();
  ASSERT_TRUE(algos.ok()) << algos.status();
  // 5632-token chunk, H = 1024, V = 176256 (its padded vocabulary).
  const cuda::LtProduct grad_weight =
      cuda::GradWeightProduct(DType::kBF16, 176256, 5632, 176256, 1024);
  auto tile = (*algos)->TileFor(grad_weight, "", nullptr);
  ASSERT_TRUE(tile.ok()) << tile.status();
  ASSERT_TRUE(tile->has_value()) << "no preferred tile offered";
  EXPECT_EQ(**tile, CUBLASLT_MATMUL_TILE_128x128) << static_cast<int>(**tile);
  // "cublas" turns the preference off: the same product goes to cublasGemmEx.
  auto off = (*algos)->TileFor(grad_weight, "cublas", nullptr);
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_FALSE(off->has_value());
}

// Above H = 2048 the default prefers the 128 x 160 tile (docs/perf/cuda.md
// step 47): the H200's cuBLAS offers it for grad_W at the chunks of the bench
// shapes of H = 3072, 4096 and 8192, and at a product of the same kind (a 5632-token chunk, H =
// 4096, 16448 vocabulary columns: too large for a whole float64 product on the
// host) it adds the product onto random values: every element against
// cublasGemmEx's result on the same inputs, within fp32 accumulation error of
// a bound on the terms' magnitudes; 4096 sampled elements against float64;
// bitwise against a repeat.
TEST(GemmAlgosOnHopperTest, DefaultWideTileAddsTheProductAtH4096) {
  SKIP_WITHOUT_CUDA_DEVICE();
  if (!OnHopper()) GTEST_SKIP() << "the preference was measured on Hopper (compute capability 9.0)";
  auto algos = GemmAlgos::Create();
  ASSERT_TRUE(algos.ok()) << algos.status();
  for (const Shape bench : {Shape{5632, 151936, 4096}, Shape{4096, 128256, 4096},
                            Shape{5632, 128256, 3072}, Shape{4096, 128256, 8192}}) {
    auto tile = (*algos)->TileFor(
        cuda::GradWeightProduct(DType::kBF16, bench.cols, bench.rows, bench.cols, bench.hidden),
        "", nullptr);
    ASSERT_TRUE(tile.ok()) << tile.status();
    ASSERT_TRUE(tile->has_value())
        << "128 x 160 not offered for " << bench.rows << " tokens at H = " << bench.hidden;
    EXPECT_EQ(**tile, CUBLASLT_MATMUL_TILE_128x160);
  }

  const Shape s{5632, 16448, 4096};
  const DType dtype = DType::kBF16;
  auto tile =
      (*algos)->TileFor(cuda::GradWeightProduct(dtype, s.cols, s.rows, s.cols, s.hidden), "",
                        nullptr);
  ASSERT_TRUE(tile.ok()) << tile.status();
  ASSERT_TRUE(tile->has_value()) << "128 x 160 not offered for the checked product";
  std::mt19937 rng(static_cast<uint32_t>(std::random_device{}()));
  GradWeightOperands op(dtype, s, &rng);
  const std::vector<float>& d = op.d;
  const std::vector<float>& x = op.x;
  const std::vector<float>& gw0 = op.gw0;
  cublasHandle_t blas = nullptr;
  ASSERT_EQ(cublasCreate(&blas), CUBLAS_STATUS_SUCCESS);
  cuda::Gemm gemm;
  gemm.handle = blas;
  gemm.dtype = dtype;
  std::vector<float> lt[2], gemm_ex;
  for (int run = 0; run < 3; ++run) {
    gemm.algos = run < 2 ? algos->get() : nullptr;  // the third: cublasGemmEx
    (run < 2 ? lt[run] : gemm_ex) = op.Run(gemm, s);
  }
  cublasDestroy(blas);
  ASSERT_EQ(lt[0].size(), gw0.size());
  ASSERT_EQ(lt[1].size(), gw0.size());
  ASSERT_EQ(gemm_ex.size(), gw0.size());
  EXPECT_EQ(std::memcmp(lt[0].data(), lt[1].data(), lt[0].size() * 4), 0)
      << "grad_W differs between two identical runs";

  // sum_t |d[t, v]| |x[t, k]| <= (sum_t |d[t, v]|) max_t |x[t, k]|.
  std::vector<double> d_abs(s.cols, 0.0), x_max(s.hidden, 0.0);
  for (int64_t t = 0; t < s.rows; ++t) {
    for (int64_t v = 0; v < s.cols; ++v) d_abs[v] += std::fabs(d[t * s.cols + v]);
    for (int64_t k = 0; k < s.hidden; ++k) {
      x_max[k] = std::max(x_max[k], static_cast<double>(std::fabs(x[t * s.hidden + k])));
    }
  }
  int64_t bad = 0;
  for (int64_t v = 0; v < s.cols; ++v) {
    for (int64_t k = 0; k < s.hidden; ++k) {
      const size_t i = static_cast<size_t>(v * s.hidden + k);
      const double tol = 1e-4 * (d_abs[v] * x_max[k] + std::fabs(gw0[i])) + 1e-6;
      if (!(std::fabs(static_cast<double>(lt[0][i]) - gemm_ex[i]) <= tol) && bad++ < 5) {
        ADD_FAILURE() << "element (" << v << ", " << k << "): " << lt[0][i] << " vs cublasGemmEx "
                      << gemm_ex[i];
      }
    }
  }
  EXPECT_EQ(bad, 0) << "elements off cublasGemmEx's result";

  std::vector<double> ref, abs_sum;
  std::vector<float> got;
  std::uniform_int_distribution<int64_t> pick_v(0, s.cols - 1), pick_k(0, s.hidden - 1);
  for (int sample = 0; sample < 4096; ++sample) {
    const int64_t v = pick_v(rng), k = pick_k(rng);
    const size_t i = static_cast<size_t>(v * s.hidden + k);
    double value = gw0[i], magnitude = std::fabs(gw0[i]);
    for (int64_t t = 0; t < s.rows; ++t) {
      const double term = static_cast<double>(d[t * s.cols + v]) * x[t * s.hidden + k];
      value += term;
      magnitude += std::fabs(term);
    }
    ref.push_back(value);
    abs_sum.push_back(magnitude);
    got.push_back(lt[0][i]);
  }
  ExpectClose(ref, abs_sum, got, "grad_W, 4096 sampled elements");
}

}  // namespace
}  // namespace flce::test
