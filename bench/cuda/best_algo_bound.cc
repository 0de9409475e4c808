#include "bench/cuda/best_algo_bound.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "bench/cuda/bench_check.h"
#include "bench/cuda/lt_algo.h"

namespace flce::bench {
namespace {

// cuBLAS's own default workspace on Hopper, which the plain bound's
// cublasGemmEx calls get.
constexpr size_t kWorkspaceBytes = size_t{32} << 20;
constexpr int kMaxAlgos = 32;
constexpr int kRounds = 3;
constexpr int kLaunches = 2;
constexpr int kSamples = 48;
constexpr const char* kNames[3] = {"logits", "grad_input", "grad_weight"};

bool LtOk(cublasStatus_t st, const std::string& what, std::string* why) {
  if (st == CUBLAS_STATUS_SUCCESS) return true;
  *why = what + ": cuBLAS status " + std::to_string(static_cast<int>(st));
  return false;
}

bool CudaOk(cudaError_t st, const std::string& what, std::string* why) {
  if (st == cudaSuccess) return true;
  *why = what + ": " + cudaGetErrorString(st);
  return false;
}

double Bf16Value(uint16_t bits) {
  const uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// count elements of a bf16 (or fp32) array from `first`, `stride` apart, as doubles.
bool Fetch(const void* base, bool fp32, int64_t first, int64_t stride, int64_t count,
           std::vector<double>* out, std::string* why) {
  const size_t es = fp32 ? 4 : 2;
  std::vector<char> raw(count * es);
  const char* src = static_cast<const char*>(base) + first * es;
  if (!CudaOk(cudaMemcpy2D(raw.data(), es, src, stride * es, es, count, cudaMemcpyDeviceToHost),
              "sample copy", why)) {
    return false;
  }
  out->resize(count);
  for (int64_t i = 0; i < count; ++i) {
    if (fp32) {
      float f;
      std::memcpy(&f, raw.data() + i * 4, 4);
      (*out)[i] = f;
    } else {
      uint16_t bits;
      std::memcpy(&bits, raw.data() + i * 2, 2);
      (*out)[i] = Bf16Value(bits);
    }
  }
  return true;
}

}  // namespace

// One product in column-major cuBLAS terms (as bound_step calls cublasGemmEx):
// logits      C (Vp x n, bf16)      = W^T-view (H x Vp)^T . x (H x n)
// grad_input  C (H x n, bf16)       = W (H x Vp) . L (Vp x n)
// grad_weight C (H x Vp, fp32)     += x (H x n) . L (Vp x n)^T
struct BestAlgoBound::Product {
  int kind = 0;
  cublasOperation_t ta = CUBLAS_OP_N, tb = CUBLAS_OP_N;
  int64_t m = 0, n = 0, k = 0, lda = 0, ldb = 0, ldc = 0;
  bool c_fp32 = false;
  float beta = 0.0f;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  cublasLtMatmulAlgo_t algo{};
  size_t algo_workspace = 0;

  ~Product() {
    if (la != nullptr) cublasLtMatrixLayoutDestroy(la);
    if (lb != nullptr) cublasLtMatrixLayoutDestroy(lb);
    if (lc != nullptr) cublasLtMatrixLayoutDestroy(lc);
    if (desc != nullptr) cublasLtMatmulDescDestroy(desc);
  }

  static std::unique_ptr<Product> Make(int kind, const BoundBuffers& b, int64_t rows,
                                       std::string* why) {
    auto p = std::make_unique<Product>();
    p->kind = kind;
    const int64_t h = b.hidden, vp = b.padded_vocab;
    if (kind == 0) {
      p->ta = CUBLAS_OP_T;
      p->m = vp, p->n = rows, p->k = h, p->lda = h, p->ldb = h, p->ldc = vp;
    } else if (kind == 1) {
      p->m = h, p->n = rows, p->k = vp, p->lda = h, p->ldb = vp, p->ldc = h;
    } else {
      p->tb = CUBLAS_OP_T;
      p->m = h, p->n = vp, p->k = rows, p->lda = h, p->ldb = vp, p->ldc = h;
      p->c_fp32 = true;
      p->beta = 1.0f;
    }
    const bool ta_n = p->ta == CUBLAS_OP_N, tb_n = p->tb == CUBLAS_OP_N;
    if (!LtOk(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "desc", why) ||
        !LtOk(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &p->ta,
                                             sizeof(p->ta)),
              "transa", why) ||
        !LtOk(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &p->tb,
                                             sizeof(p->tb)),
              "transb", why) ||
        !LtOk(cublasLtMatrixLayoutCreate(&p->la, CUDA_R_16BF, ta_n ? p->m : p->k,
                                         ta_n ? p->k : p->m, p->lda),
              "layout A", why) ||
        !LtOk(cublasLtMatrixLayoutCreate(&p->lb, CUDA_R_16BF, tb_n ? p->k : p->n,
                                         tb_n ? p->n : p->k, p->ldb),
              "layout B", why) ||
        !LtOk(cublasLtMatrixLayoutCreate(&p->lc, p->c_fp32 ? CUDA_R_32F : CUDA_R_16BF, p->m, p->n,
                                         p->ldc),
              "layout C", why)) {
      return nullptr;
    }
    return p;
  }

  struct Operands {
    const void* a;
    const void* b;
    void* c;
  };
  Operands At(const BoundBuffers& b, int64_t c0) const {
    const char* x = static_cast<const char*>(b.x) + c0 * b.hidden * 2;
    if (kind == 0) return {b.w, x, b.logits};
    if (kind == 1) {
      return {b.w, b.logits, static_cast<char*>(b.grad_input) + c0 * b.hidden * 2};
    }
    return {x, b.logits, b.grad_weight};
  }

  cublasStatus_t Launch(cublasLtHandle_t lt, const cublasLtMatmulAlgo_t& with,
                        const BoundBuffers& b, int64_t c0, void* workspace,
                        cudaStream_t stream) const {
    const float alpha = 1.0f;
    const Operands o = At(b, c0);
    return cublasLtMatmul(lt, desc, &alpha, o.a, la, o.b, lb, &beta, o.c, lc, o.c, lc, &with,
                          workspace, kWorkspaceBytes, stream);
  }

  // Every heuristic algorithm timed (kRounds rounds of kLaunches, the order
  // reversed every round); the fastest kept in `algo`.
  bool Search(cublasLtHandle_t lt, const BoundBuffers& b, void* workspace, cudaStream_t stream,
              nlohmann::json* report, std::string* why) {
    cublasLtMatmulPreference_t pref;
    if (!LtOk(cublasLtMatmulPreferenceCreate(&pref), "preference", why)) return false;
    const size_t ws = kWorkspaceBytes;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                         sizeof(ws));
    std::vector<cublasLtMatmulHeuristicResult_t> found(kMaxAlgos);
    int count = 0;
    const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, lc, pref,
                                                             kMaxAlgos, found.data(), &count);
    cublasLtMatmulPreferenceDestroy(pref);
    if (!LtOk(st, "heuristic", why)) return false;
    if (count == 0) {
      *why = std::string(kNames[kind]) + ": the heuristic offers no algorithm";
      return false;
    }
    found.resize(count);
    std::vector<bool> usable(count, true);
    for (int i = 0; i < count; ++i) {
      usable[i] = Launch(lt, found[i].algo, b, 0, workspace, stream) == CUBLAS_STATUS_SUCCESS;
    }
    if (!CudaOk(cudaStreamSynchronize(stream), "warm-up", why)) return false;
    cudaEvent_t start, stop;
    cudaEventCreate(&start);
    cudaEventCreate(&stop);
    std::vector<std::vector<double>> ms(count);
    for (int r = 0; r < kRounds; ++r) {
      for (int j = 0; j < count; ++j) {
        const int i = r % 2 ? count - 1 - j : j;
        if (!usable[i]) continue;
        cudaEventRecord(start, stream);
        for (int l = 0; l < kLaunches; ++l) Launch(lt, found[i].algo, b, 0, workspace, stream);
        cudaEventRecord(stop, stream);
        if (!CudaOk(cudaEventSynchronize(stop), "timing", why)) return false;
        float t = 0.0f;
        cudaEventElapsedTime(&t, start, stop);
        ms[i].push_back(t / kLaunches);
      }
    }
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    int best = -1;
    nlohmann::json algos = nlohmann::json::array();
    for (int i = 0; i < count; ++i) {
      const double med = usable[i] ? Median(ms[i]) : -1.0;
      nlohmann::json entry = DescribeAlgo(found[i].algo);
      entry["heuristic_rank"] = i;
      entry["ms"] = usable[i] ? nlohmann::json(med) : nullptr;
      algos.push_back(entry);
      if (usable[i] && (best < 0 || med < Median(ms[best]))) best = i;
    }
    if (best < 0) {
      *why = std::string(kNames[kind]) + ": no algorithm ran";
      return false;
    }
    algo = found[best].algo;
    algo_workspace = found[best].workspaceSize;
    *report = {{"product", kNames[kind]},
               {"m", m},
               {"n", n},
               {"k", k},
               {"algos", algos},
               {"chosen_rank", best},
               {"chosen_ms", Median(ms[best])},
               {"heuristic_first_ms", algos[0]["ms"]}};
    return true;
  }

  // The chosen algorithm once at chunk 0 against float64 sums of sampled
  // entries (grad_W: the increment over what C held before).
  bool Check(cublasLtHandle_t lt, const BoundBuffers& b, void* workspace, cudaStream_t stream,
             nlohmann::json* report, std::string* why) {
    std::mt19937_64 rng(std::random_device{}());
    std::uniform_int_distribution<int64_t> row(0, m - 1), col(0, n - 1);
    std::vector<std::pair<int64_t, int64_t>> at(kSamples);
    for (auto& ij : at) ij = {row(rng), col(rng)};
    const Operands o = At(b, 0);
    std::vector<double> before(kSamples, 0.0), one;
    if (beta != 0.0f) {
      for (int s = 0; s < kSamples; ++s) {
        if (!Fetch(o.c, c_fp32, at[s].first + at[s].second * ldc, 1, 1, &one, why)) return false;
        before[s] = one[0];
      }
    }
    if (!LtOk(Launch(lt, algo, b, 0, workspace, stream), "checked run", why) ||
        !CudaOk(cudaStreamSynchronize(stream), "checked run", why)) {
      return false;
    }
    double worst = 0.0;
    std::vector<double> arow, bcol;
    for (int s = 0; s < kSamples; ++s) {
      const auto [i, j] = at[s];
      // Row i of op(A) and column j of op(B), k entries each.
      const bool a_ok = ta == CUBLAS_OP_N ? Fetch(o.a, false, i, lda, k, &arow, why)
                                          : Fetch(o.a, false, i * lda, 1, k, &arow, why);
      const bool b_ok = tb == CUBLAS_OP_N ? Fetch(o.b, false, j * ldb, 1, k, &bcol, why)
                                          : Fetch(o.b, false, j, ldb, k, &bcol, why);
      if (!a_ok || !b_ok || !Fetch(o.c, c_fp32, i + j * ldc, 1, 1, &one, why)) return false;
      double sum = 0.0, abs_sum = 0.0;
      for (int64_t l = 0; l < k; ++l) {
        sum += arow[l] * bcol[l];
        abs_sum += std::abs(arow[l] * bcol[l]);
      }
      const double got = one[0] - before[s];
      worst = std::max(worst, std::abs(got - sum) / std::max(abs_sum, 1e-30));
    }
    // bf16 outputs round by 2^-9; fp32 accumulation over k terms stays far
    // below 1e-3 of the absolute sum. A wrong algorithm is off by O(1).
    const double tolerance = c_fp32 ? 1e-3 : 1e-2;
    (*report)["check"] = {
        {"samples", kSamples}, {"worst_error_over_abs_sum", worst}, {"tolerance", tolerance}};
    if (!(worst <= tolerance)) {
      *why = std::string(kNames[kind]) + ": the chosen algorithm's product is off by " +
             std::to_string(worst) + " of the absolute sum";
      return false;
    }
    return true;
  }
};

BestAlgoBound::~BestAlgoBound() {
  if (workspace_ != nullptr) cudaFree(workspace_);
}

std::unique_ptr<BestAlgoBound> BestAlgoBound::Search(cublasLtHandle_t lt, cudaStream_t stream,
                                                     const BoundBuffers& buffers, int64_t chunk,
                                                     nlohmann::json* report, std::string* why) {
  std::unique_ptr<BestAlgoBound> bound(new BestAlgoBound());
  bound->lt_ = lt;
  bound->stream_ = stream;
  bound->b_ = buffers;
  bound->chunk_ = std::min(chunk, buffers.rows);
  if (!CudaOk(cudaMalloc(&bound->workspace_, kWorkspaceBytes), "workspace", why)) return nullptr;
  *report = {{"workspace_bytes", kWorkspaceBytes},
             {"chunk_tokens", bound->chunk_},
             {"products", nlohmann::json::array()}};
  // In order: the logits product writes what the other two read.
  for (int kind = 0; kind < 3; ++kind) {
    bound->full_[kind] = Product::Make(kind, buffers, bound->chunk_, why);
    nlohmann::json product;
    if (bound->full_[kind] == nullptr ||
        !bound->full_[kind]->Search(lt, buffers, bound->workspace_, stream, &product, why) ||
        !bound->full_[kind]->Check(lt, buffers, bound->workspace_, stream, &product, why)) {
      return nullptr;
    }
    (*report)["products"].push_back(product);
  }
  const int64_t tail = buffers.rows % bound->chunk_;
  if (tail != 0) {
    nlohmann::json tails = nlohmann::json::array();
    for (int kind = 0; kind < 3; ++kind) {
      auto p = Product::Make(kind, buffers, tail, why);
      if (p == nullptr) return nullptr;
      cublasLtMatmulHeuristicResult_t checked{};
      const bool same =
          cublasLtMatmulAlgoCheck(lt, p->desc, p->la, p->lb, p->lc, p->lc,
                                  &bound->full_[kind]->algo, &checked) == CUBLAS_STATUS_SUCCESS;
      if (same) {
        p->algo = bound->full_[kind]->algo;
      } else {
        nlohmann::json ignored;
        if (!p->Search(lt, buffers, bound->workspace_, stream, &ignored, why)) return nullptr;
      }
      tails.push_back({{"product", kNames[kind]},
                       {"rows", tail},
                       {"algorithm", same ? "the full chunk's" : "searched"}});
      bound->tail_[kind] = std::move(p);
    }
    (*report)["last_chunk"] = tails;
  }
  return bound;
}

bool BestAlgoBound::Run(std::string* why) {
  for (int64_t c0 = 0; c0 < b_.rows; c0 += chunk_) {
    const bool full = b_.rows - c0 >= chunk_;
    for (int kind = 0; kind < 3; ++kind) {
      const Product& p = full ? *full_[kind] : *tail_[kind];
      if (!LtOk(p.Launch(lt_, p.algo, b_, c0, workspace_, stream_), kNames[kind], why)) {
        return false;
      }
    }
  }
  return true;
}

}  // namespace flce::bench
