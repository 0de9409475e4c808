// grad_W's cuBLAS algorithm where cublasGemmEx's default is not the fastest
// one cuBLAS has. The default heuristic takes 256 x 128 and larger tiles; on
// the H200 cuBLAS's 128 x 128 algorithm is the faster for grad_W at H = 1024,
// and its 128 x 160 one above H = 2048, where it is also ahead of flce's own
// grad_W kernel (docs/perf/cuda.md). A product runs on cublasLt with the
// heuristic's first algorithm of the most preferred tile the heuristic
// offers; none offered, it is left to cublasGemmEx. The choice depends on the
// heuristic's list alone (never on timings), so results are bitwise the same
// in every process on the same GPU and cuBLAS version. FLCE_CUDA_GEMM_TILES=
// measured instead times the heuristic's first algorithms on each product's
// first runs and keeps the fastest: the winner may differ between processes,
// so a deterministic call's plan keeps the fixed list (plan_parts::PlanSwitches).
#ifndef FLCE_KERNELS_CUDA_OPS_GEMM_ALGOS_H_
#define FLCE_KERNELS_CUDA_OPS_GEMM_ALGOS_H_

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/cuda/base/cuda_status.h"
#include "kernels/cuda/base/device_memory.h"

namespace flce::cuda {

// FLCE_CUDA_GEMM_TILES: a comma-separated list of tiles in order of
// preference; unset or "" = grad_W's fastest at `hidden`: "128x128" up to
// H = 2048, "128x160" above; "cublas" = cublasGemmEx's default
// everywhere; "measured" = no list (MeasuredGemmTiles). Unknown names are an
// InvalidArgumentError (at engine creation, and at a call if the variable has
// changed since).
absl::StatusOr<std::vector<cublasLtMatmulTile_t>> PreferredGemmTiles(const char* env,
                                                                     int64_t hidden);

// Whether grad_W of a chunk of `rows` tokens at `hidden` asks for a preferred
// tile, FLCE_CUDA_GEMM_TILES being `env`: chunks of 2048 tokens and more; with
// the default list only from H = 1024 up, where the preferred tile is the
// faster (below it cuBLAS's own heuristic wins at some shapes, loses at
// others: docs/perf/cuda.md); a list that is set applies at every H.
bool PreferTileForGradWeight(int64_t rows, int64_t hidden, const char* env);

// FLCE_CUDA_GEMM_TILES=measured: each grad_W product (by shape) runs its first
// kMeasuredCandidates x kMeasuredSamples times on the heuristic's first
// kMeasuredCandidates algorithms in turn, timed by events on its stream (each
// run computes the product: the runs are the call's own), and from then on on
// the fastest (the least of its samples), at every H where a tile would be
// preferred.
bool MeasuredGemmTiles(const char* env);
inline constexpr int kMeasuredCandidates = 16;
inline constexpr int kMeasuredSamples = 2;

// A column-major product C (m x n, fp32) = alpha op_a(A) op_b(B) + beta C with
// 16-bit A and B, as kernels/cuda/ops/gemm.cc spells the plans' GEMMs.
struct LtProduct {
  cudaDataType_t ab_type = CUDA_R_16BF;
  cublasOperation_t op_a = CUBLAS_OP_N, op_b = CUBLAS_OP_N;
  int64_t m = 0, n = 0, k = 0;
  int64_t lda = 0, ldb = 0, ldc = 0;
  cudaDataType_t c_type = CUDA_R_32F;
  float beta = 0.0f;
  auto Key() const {
    return std::make_tuple(static_cast<int>(ab_type), static_cast<int>(op_a),
                           static_cast<int>(op_b), m, n, k, lda, ldb, ldc, static_cast<int>(c_type),
                           beta != 0.0f);
  }
};

// One per engine: its GEMMs run on one stream at a time (the workspace is shared).
class GemmAlgos {
 public:
  // Checks FLCE_CUDA_GEMM_TILES's spelling; the cublasLt handle and workspace
  // are made at the first product a tile is preferred for.
  static absl::StatusOr<std::unique_ptr<GemmAlgos>> Create();
  ~GemmAlgos();
  GemmAlgos(const GemmAlgos&) = delete;
  GemmAlgos& operator=(const GemmAlgos&) = delete;

  // Runs p with the algorithm of the most preferred tile of `tiles` (the
  // plan's FLCE_CUDA_GEMM_TILES, KernelSwitches::gemm_tiles), or with the
  // candidate or winner of its trial where `tiles` is "measured", and returns
  // true, or returns false without running anything where cublasLt offers
  // none for p.
  absl::StatusOr<bool> Run(const LtProduct& p, const std::string& tiles, const void* a,
                           const void* b, void* c, cudaStream_t stream, DeviceHealth* health);
  // The preferred tile Run takes for p; none where it leaves p to cublasGemmEx.
  absl::StatusOr<std::optional<cublasLtMatmulTile_t>> TileFor(const LtProduct& p,
                                                              const std::string& tiles,
                                                              DeviceHealth* health);

 private:
  GemmAlgos() = default;
  struct Descriptors;
  struct Choice {
    bool found = false;
    cublasLtMatmulAlgo_t algo{};
    cublasLtMatmulTile_t tile = CUBLASLT_MATMUL_TILE_UNDEFINED;
    std::shared_ptr<const Descriptors> descriptors;  // made once, for every Run of the product
  };
  // A product's timed candidates under "measured", until one is chosen.
  struct Trial {
    std::shared_ptr<const Descriptors> descriptors;
    std::vector<cublasLtMatmulAlgo_t> candidates;
    struct Sample {
      int candidate;
      cudaEvent_t start, end;
    };
    std::vector<Sample> samples;
    int best = -1;  // into candidates, once decided
    // None offered (cublasGemmEx runs), or the winner chosen.
    bool decided() const { return candidates.empty() || best >= 0; }
    void ReleaseSamples();  // destroys the samples' events
    ~Trial() { ReleaseSamples(); }
  };
  absl::StatusOr<Choice> Choose(const LtProduct& p, const std::string& tiles,
                                DeviceHealth* health);
  absl::StatusOr<bool> RunMeasured(const LtProduct& p, const void* a, const void* b, void* c,
                                   cudaStream_t stream, DeviceHealth* health);
  absl::StatusOr<Trial*> TrialFor(const LtProduct& p, DeviceHealth* health);  // under mu_
  absl::Status Decide(Trial* trial, DeviceHealth* health);                     // under mu_
  absl::Status Matmul(const Descriptors& d, const cublasLtMatmulAlgo_t& algo, float beta,
                      const void* a, const void* b, void* c, cudaStream_t stream,
                      DeviceHealth* health);
  absl::Status EnsureHandle(DeviceHealth* health);  // under mu_
  static absl::Status Describe(const LtProduct& p, Descriptors* d, DeviceHealth* health);

  cublasLtHandle_t handle_ = nullptr;  // with workspace_, made at the first preferred product
  DeviceBuffer workspace_;
  std::mutex mu_;
  // By the tiles' spelling and the product.
  std::map<std::pair<std::string, decltype(LtProduct().Key())>, Choice> chosen_;
  std::map<decltype(LtProduct().Key()), std::unique_ptr<Trial>> trials_;
};

}  // namespace flce::cuda

#endif  // FLCE_KERNELS_CUDA_OPS_GEMM_ALGOS_H_
