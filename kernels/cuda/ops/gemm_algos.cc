#include "kernels/cuda/ops/gemm_algos.h"

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "core/status_macros.h"
#include "kernels/cuda/base/kernel_choices.h"

namespace flce::cuda {
namespace {

// Enough for every algorithm the preference picks at the bench's shapes
// (they ask for a few bytes); algorithms wanting more are not offered.
constexpr int64_t kWorkspaceBytes = int64_t{1} << 20;
constexpr int kHeuristicCount = 16;
constexpr absl::string_view kDefaultTiles = "128x128";
constexpr absl::string_view kDefaultWideTiles = "128x160";
constexpr int64_t kWideTileAboveHidden = 2048;
constexpr absl::string_view kNoPreference = "cublas";  // cublasGemmEx's default everywhere
constexpr absl::string_view kMeasured = "measured";    // no list: timed (MeasuredGemmTiles)
constexpr int64_t kTileMinRows = 2048;
constexpr int64_t kDefaultTileMinHidden = 1024;

struct NamedTile {
  const char* name;
  cublasLtMatmulTile_t tile;
};
constexpr NamedTile kTiles[] = {
    {"64x128", CUBLASLT_MATMUL_TILE_64x128},   {"64x256", CUBLASLT_MATMUL_TILE_64x256},
    {"128x64", CUBLASLT_MATMUL_TILE_128x64},   {"128x128", CUBLASLT_MATMUL_TILE_128x128},
    {"128x160", CUBLASLT_MATMUL_TILE_128x160}, {"128x192", CUBLASLT_MATMUL_TILE_128x192},
    {"128x256", CUBLASLT_MATMUL_TILE_128x256}, {"192x128", CUBLASLT_MATMUL_TILE_192x128},
    {"192x192", CUBLASLT_MATMUL_TILE_192x192}, {"256x64", CUBLASLT_MATMUL_TILE_256x64},
    {"256x128", CUBLASLT_MATMUL_TILE_256x128}, {"320x128", CUBLASLT_MATMUL_TILE_320x128},
};

// Set to "" reads as unset, as the engine's other switches do.
bool Unset(const char* env) { return env == nullptr || *env == '\0'; }

// The spelling the choices are keyed by.
std::string Spelling(const char* env) { return Unset(env) ? "" : std::string("=") + env; }

}  // namespace

// A product's cublasLt descriptors, made once with its choice.
struct GemmAlgos::Descriptors {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~Descriptors() {
    if (pref != nullptr) cublasLtMatmulPreferenceDestroy(pref);
    if (c != nullptr) cublasLtMatrixLayoutDestroy(c);
    if (b != nullptr) cublasLtMatrixLayoutDestroy(b);
    if (a != nullptr) cublasLtMatrixLayoutDestroy(a);
    if (desc != nullptr) cublasLtMatmulDescDestroy(desc);
  }
};

absl::Status GemmAlgos::Describe(const LtProduct& p, Descriptors* d, DeviceHealth* health) {
  FLCE_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescCreate(&d->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F),
                              health);
  FLCE_CUBLAS_RETURN_IF_ERROR(
      cublasLtMatmulDescSetAttribute(d->desc, CUBLASLT_MATMUL_DESC_TRANSA, &p.op_a, sizeof(p.op_a)),
      health);
  FLCE_CUBLAS_RETURN_IF_ERROR(
      cublasLtMatmulDescSetAttribute(d->desc, CUBLASLT_MATMUL_DESC_TRANSB, &p.op_b, sizeof(p.op_b)),
      health);
  const bool ta = p.op_a != CUBLAS_OP_N, tb = p.op_b != CUBLAS_OP_N;
  FLCE_CUBLAS_RETURN_IF_ERROR(
      cublasLtMatrixLayoutCreate(&d->a, p.ab_type, ta ? p.k : p.m, ta ? p.m : p.k, p.lda), health);
  FLCE_CUBLAS_RETURN_IF_ERROR(
      cublasLtMatrixLayoutCreate(&d->b, p.ab_type, tb ? p.n : p.k, tb ? p.k : p.n, p.ldb), health);
  FLCE_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&d->c, p.c_type, p.m, p.n, p.ldc), health);
  FLCE_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceCreate(&d->pref), health);
  const size_t workspace = kWorkspaceBytes;
  FLCE_CUBLAS_RETURN_IF_ERROR(
      cublasLtMatmulPreferenceSetAttribute(d->pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                           &workspace, sizeof(workspace)),
      health);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<cublasLtMatmulTile_t>> PreferredGemmTiles(const char* env,
                                                                     int64_t hidden) {
  // The default is grad_W's fastest tile on the H200: 128 x 128 up to
  // kWideTileAboveHidden, 128 x 160 above it (docs/perf/cuda.md).
  const absl::string_view by_hidden =
      hidden > kWideTileAboveHidden ? kDefaultWideTiles : kDefaultTiles;
  const absl::string_view spelled = Unset(env) ? by_hidden : env;
  std::vector<cublasLtMatmulTile_t> tiles;
  if (spelled == kNoPreference || spelled == kMeasured) return tiles;
  for (const absl::string_view name : absl::StrSplit(spelled, ',')) {
    bool known = false;
    for (const NamedTile& t : kTiles) {
      if (name == t.name) {
        tiles.push_back(t.tile);
        known = true;
      }
    }
    if (!known) {
      return absl::InvalidArgumentError(
          absl::StrCat("FLCE_CUDA_GEMM_TILES=", spelled, ": unknown tile '", name,
                       "' (\"cublas\", \"measured\", or a comma-separated list such as "
                       "128x128,128x160)"));
    }
  }
  return tiles;
}

bool PreferTileForGradWeight(int64_t rows, int64_t hidden, const char* env) {
  if (rows < kTileMinRows) return false;
  if (Unset(env)) return hidden >= kDefaultTileMinHidden;
  return env != kNoPreference;
}

bool MeasuredGemmTiles(const char* env) { return !Unset(env) && env == kMeasured; }

absl::StatusOr<std::unique_ptr<GemmAlgos>> GemmAlgos::Create() {
  // Checks the spelling only: the default list is valid at every H.
  FLCE_RETURN_IF_ERROR(
      PreferredGemmTiles(KernelSwitchesFromEnvironment().gemm_tiles.c_str(), 0).status());
  return std::unique_ptr<GemmAlgos>(new GemmAlgos());
}

GemmAlgos::~GemmAlgos() {
  if (handle_ != nullptr) cublasLtDestroy(handle_);
}

absl::StatusOr<GemmAlgos::Choice> GemmAlgos::Choose(const LtProduct& p, const std::string& tiles,
                                                    DeviceHealth* health) {
  std::lock_guard<std::mutex> lock(mu_);
  const char* env = tiles.c_str();
  const auto key = std::make_pair(Spelling(env), p.Key());
  if (auto it = chosen_.find(key); it != chosen_.end()) return it->second;
  // The products are grad_W's (GradWeightProduct), whose m is H.
  FLCE_ASSIGN_OR_RETURN(const std::vector<cublasLtMatmulTile_t> preferred,
                        PreferredGemmTiles(env, p.m));
  Choice choice;
  if (preferred.empty()) {
    chosen_[key] = choice;
    return choice;
  }
  FLCE_RETURN_IF_ERROR(EnsureHandle(health));
  auto d = std::make_shared<Descriptors>();
  FLCE_RETURN_IF_ERROR(Describe(p, d.get(), health));
  cublasLtMatmulHeuristicResult_t found[kHeuristicCount] = {};
  int count = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(handle_, d->desc, d->a, d->b, d->c, d->c,
                                                           d->pref, kHeuristicCount, found, &count);
  // NOT_SUPPORTED: no algorithm at all for this layout; cublasGemmEx decides.
  if (st != CUBLAS_STATUS_NOT_SUPPORTED) FLCE_CUBLAS_RETURN_IF_ERROR(st, health);
  for (const cublasLtMatmulTile_t want : preferred) {
    for (int i = 0; i < count && !choice.found; ++i) {
      uint32_t tile = 0;
      size_t written = 0;
      FLCE_CUBLAS_RETURN_IF_ERROR(
          cublasLtMatmulAlgoConfigGetAttribute(&found[i].algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile,
                                               sizeof(tile), &written),
          health);
      if (found[i].state == CUBLAS_STATUS_SUCCESS && tile == static_cast<uint32_t>(want)) {
        choice = {true, found[i].algo, want, d};
      }
    }
    if (choice.found) break;
  }
  chosen_[key] = choice;
  return choice;
}

absl::Status GemmAlgos::EnsureHandle(DeviceHealth* health) {
  if (handle_ != nullptr) return absl::OkStatus();
  // First use: engines that never prefer a tile hold neither.
  FLCE_ASSIGN_OR_RETURN(workspace_, DeviceBuffer::Allocate(kWorkspaceBytes, health));
  FLCE_CUBLAS_RETURN_IF_ERROR(cublasLtCreate(&handle_), health);
  return absl::OkStatus();
}

absl::Status GemmAlgos::Matmul(const Descriptors& d, const cublasLtMatmulAlgo_t& algo, float beta,
                               const void* a, const void* b, void* c, cudaStream_t stream,
                               DeviceHealth* health) {
  const float alpha = 1.0f;
  FLCE_CUBLAS_RETURN_IF_ERROR(cublasLtMatmul(handle_, d.desc, &alpha, a, d.a, b, d.b, &beta, c,
                                             d.c, c, d.c, &algo, workspace_.get(),
                                             kWorkspaceBytes, stream),
                              health);
  return absl::OkStatus();
}

absl::StatusOr<bool> GemmAlgos::Run(const LtProduct& p, const std::string& tiles, const void* a,
                                    const void* b, void* c, cudaStream_t stream,
                                    DeviceHealth* health) {
  if (MeasuredGemmTiles(tiles.c_str())) return RunMeasured(p, a, b, c, stream, health);
  FLCE_ASSIGN_OR_RETURN(const Choice choice, Choose(p, tiles, health));
  if (!choice.found) return false;
  FLCE_RETURN_IF_ERROR(Matmul(*choice.descriptors, choice.algo, p.beta, a, b, c, stream, health));
  return true;
}

void GemmAlgos::Trial::ReleaseSamples() {
  for (const Sample& s : samples) {
    cudaEventDestroy(s.start);
    cudaEventDestroy(s.end);
  }
  samples.clear();
}

absl::StatusOr<GemmAlgos::Trial*> GemmAlgos::TrialFor(const LtProduct& p, DeviceHealth* health) {
  std::unique_ptr<Trial>& trial = trials_[p.Key()];
  if (trial != nullptr) return trial.get();
  FLCE_RETURN_IF_ERROR(EnsureHandle(health));
  auto made = std::make_unique<Trial>();
  auto d = std::make_shared<Descriptors>();
  FLCE_RETURN_IF_ERROR(Describe(p, d.get(), health));
  cublasLtMatmulHeuristicResult_t found[kMeasuredCandidates] = {};
  int count = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(
      handle_, d->desc, d->a, d->b, d->c, d->c, d->pref, kMeasuredCandidates, found, &count);
  // NOT_SUPPORTED: no algorithm at all for this layout; cublasGemmEx decides.
  if (st != CUBLAS_STATUS_NOT_SUPPORTED) FLCE_CUBLAS_RETURN_IF_ERROR(st, health);
  for (int i = 0; i < count; ++i) {
    if (found[i].state == CUBLAS_STATUS_SUCCESS) made->candidates.push_back(found[i].algo);
  }
  made->descriptors = std::move(d);
  trial = std::move(made);
  return trial.get();
}

absl::Status GemmAlgos::Decide(Trial* trial, DeviceHealth* health) {
  std::vector<float> least(trial->candidates.size(), std::numeric_limits<float>::infinity());
  for (const Trial::Sample& s : trial->samples) {
    float ms = 0.0f;
    FLCE_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(s.end), health);
    FLCE_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, s.start, s.end), health);
    least[s.candidate] = std::min(least[s.candidate], ms);
  }
  trial->best = static_cast<int>(std::min_element(least.begin(), least.end()) - least.begin());
  trial->ReleaseSamples();
  return absl::OkStatus();
}

absl::StatusOr<bool> GemmAlgos::RunMeasured(const LtProduct& p, const void* a, const void* b,
                                            void* c, cudaStream_t stream, DeviceHealth* health) {
  std::lock_guard<std::mutex> lock(mu_);
  FLCE_ASSIGN_OR_RETURN(Trial* const trial, TrialFor(p, health));
  const int candidates = static_cast<int>(trial->candidates.size());
  const int started = static_cast<int>(trial->samples.size());
  if (!trial->decided() && started == candidates * kMeasuredSamples) {
    FLCE_RETURN_IF_ERROR(Decide(trial, health));
  }
  if (trial->decided()) {
    if (trial->best < 0) return false;
    FLCE_RETURN_IF_ERROR(Matmul(*trial->descriptors, trial->candidates[trial->best], p.beta, a,
                                b, c, stream, health));
    return true;
  }
  // The candidates in turn, so that each one's samples fall at different times.
  Trial::Sample sample{started % candidates, nullptr, nullptr};
  FLCE_CUDA_RETURN_IF_ERROR(cudaEventCreate(&sample.start), health);
  if (const cudaError_t err = cudaEventCreate(&sample.end); err != cudaSuccess) {
    cudaEventDestroy(sample.start);
    return CudaStatus(err, "creating a GEMM trial's event", health);
  }
  trial->samples.push_back(sample);  // destroyed with the trial from here on
  FLCE_CUDA_RETURN_IF_ERROR(cudaEventRecord(sample.start, stream), health);
  FLCE_RETURN_IF_ERROR(Matmul(*trial->descriptors, trial->candidates[sample.candidate], p.beta, a,
                              b, c, stream, health));
  FLCE_CUDA_RETURN_IF_ERROR(cudaEventRecord(sample.end, stream), health);
  return true;
}

absl::StatusOr<std::optional<cublasLtMatmulTile_t>> GemmAlgos::TileFor(const LtProduct& p,
                                                                       const std::string& tiles,
                                                                       DeviceHealth* health) {
  FLCE_ASSIGN_OR_RETURN(const Choice choice, Choose(p, tiles, health));
  if (!choice.found) return std::nullopt;
  return choice.tile;
}

}  // namespace flce::cuda
