// flce_gemm_algo_bench: the backward GEMMs the chunked plan leaves to cuBLAS,
// timed with cublasGemmEx's default algorithm and with every algorithm
// cublasLt's heuristic offers for the same product, in alternating rounds
// in one process. It answers whether the default heuristic leaves time on
// the table at flce's chunk sizes (docs/perf/cuda.md).
//
// Usage:
//   flce_gemm_algo_bench --out=bench/results/gemm-algos.json --commit=$(git rev-parse HEAD)
//   flce_gemm_algo_bench --problems=grad_weight:5632:1024:176256 --rounds=15
//     (GEMM:ROWS:HIDDEN:COLS, comma-separated; GEMM is grad_weight or grad_input,
//     in the row-major terms of kernels/cuda/ops/gemm.h)
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "bench/cuda/bench_check.h"
#include "bench/cuda/bench_data.cuh"
#include "bench/cuda/lt_algo.h"
#include "nlohmann/json.hpp"

namespace {

#define CHECK_CUBLAS(expr)                                                                       \
  do {                                                                                           \
    const cublasStatus_t st_ = (expr);                                                           \
    if (st_ != CUBLAS_STATUS_SUCCESS) {                                                          \
      std::fprintf(stderr, "%s:%d %s: cuBLAS status %d\n", __FILE__, __LINE__, #expr, int(st_)); \
      std::exit(1);                                                                              \
    }                                                                                            \
  } while (0)

struct Problem {
  std::string gemm;  // grad_weight | grad_input
  int64_t rows = 0, hidden = 0, cols = 0;
};

struct Flags {
  std::vector<Problem> problems = {{"grad_weight", 5632, 1024, 176256},
                                   {"grad_input", 5632, 1024, 176256},
                                   {"grad_input", 5632, 4096, 151936},
                                   {"grad_weight", 5632, 4096, 151936}};
  int rounds = 15;
  int launches = 3;  // back to back per timing, so each times a loaded GPU
  int max_algos = 32;
  size_t workspace = size_t{32} << 20;
  std::string out, commit;
};

Flags ParseFlags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const size_t eq = a.find('=');
    const std::string key = a.substr(0, eq), v = eq == std::string::npos ? "" : a.substr(eq + 1);
    bool ok = true;
    if (key == "--problems") {
      f.problems.clear();
      for (const absl::string_view p : absl::StrSplit(v, ',')) {
        const std::vector<std::string> parts = absl::StrSplit(p, ':');
        Problem q;
        ok = parts.size() == 4 && (parts[0] == "grad_weight" || parts[0] == "grad_input") &&
             absl::SimpleAtoi(parts[1], &q.rows) && absl::SimpleAtoi(parts[2], &q.hidden) &&
             absl::SimpleAtoi(parts[3], &q.cols);
        q.gemm = parts.empty() ? "" : parts[0];
        if (!ok) break;
        f.problems.push_back(q);
      }
    } else if (key == "--rounds") {
      ok = absl::SimpleAtoi(v, &f.rounds) && f.rounds > 0;
    } else if (key == "--launches") {
      ok = absl::SimpleAtoi(v, &f.launches) && f.launches > 0;
    } else if (key == "--max-algos") {
      ok = absl::SimpleAtoi(v, &f.max_algos) && f.max_algos > 0;
    } else if (key == "--out") {
      f.out = v;
    } else if (key == "--commit") {
      f.commit = v;
    } else {
      ok = false;
    }
    if (!ok) {
      std::fprintf(stderr, "bad flag %s (see the usage at the top of gemm_algo_bench.cc)\n",
                   a.c_str());
      std::exit(2);
    }
  }
  return f;
}

using flce::bench::Median;

// One product, in column-major cuBLAS terms (as kernels/cuda/ops/gemm.cc calls it):
// grad_weight: C (H x cols, fp32) += A (H x rows) . B (cols x rows)^T
// grad_input:  C (H x rows, fp32)  = A (H x cols) . B (cols x rows)
struct Operands {
  int64_t m = 0, n = 0, k = 0;
  cublasOperation_t trans_b = CUBLAS_OP_N;
  int64_t lda = 0, ldb = 0, ldc = 0;
  int64_t b_rows = 0, b_cols = 0;
  float beta = 0.0f;
};

Operands OperandsOf(const Problem& p) {
  Operands o;
  if (p.gemm == "grad_weight") {
    o = {p.hidden, p.cols, p.rows, CUBLAS_OP_T, p.hidden, p.cols, p.hidden, p.cols, p.rows, 1.0f};
  } else {
    o = {p.hidden, p.rows, p.cols, CUBLAS_OP_N, p.hidden, p.cols, p.hidden, p.cols, p.rows, 0.0f};
  }
  return o;
}

nlohmann::json RunProblem(const Flags& flags, const Problem& p, cublasHandle_t blas,
                          cublasLtHandle_t lt, cudaStream_t stream, void* workspace) {
  const Operands o = OperandsOf(p);
  void *a = nullptr, *b = nullptr;
  float* c = nullptr;
  CHECK_CUDA(cudaMalloc(&a, o.m * o.k * 2));
  CHECK_CUDA(cudaMalloc(&b, o.b_rows * o.b_cols * 2));
  CHECK_CUDA(cudaMalloc(&c, o.m * o.n * sizeof(float)));
  CHECK_CUDA(flce::bench::FillNormalBf16(a, o.m * o.k, 1.0f, 11, stream));
  CHECK_CUDA(flce::bench::FillNormalBf16(b, o.b_rows * o.b_cols, 0.05f, 12, stream));
  CHECK_CUDA(flce::bench::FillNormalF32(c, o.m * o.n, 1.0f, 13, stream));

  cublasLtMatmulDesc_t desc;
  CHECK_CUBLAS(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t trans_a = CUBLAS_OP_N;
  CHECK_CUBLAS(
      cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof(trans_a)));
  CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &o.trans_b,
                                              sizeof(o.trans_b)));
  cublasLtMatrixLayout_t la, lb, lc;
  CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, o.m, o.k, o.lda));
  CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, o.b_rows, o.b_cols, o.ldb));
  CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, o.m, o.n, o.ldc));
  cublasLtMatmulPreference_t pref;
  CHECK_CUBLAS(cublasLtMatmulPreferenceCreate(&pref));
  CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                    &flags.workspace, sizeof(flags.workspace)));
  std::vector<cublasLtMatmulHeuristicResult_t> found(flags.max_algos);
  int count = 0;
  CHECK_CUBLAS(cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, lc, pref, flags.max_algos,
                                              found.data(), &count));
  found.resize(count);

  const float alpha = 1.0f;
  // Entry 0: cublasGemmEx's default, as the plans call it; then the heuristic's list.
  auto launch = [&](int entry) {
    if (entry == 0) {
      CHECK_CUBLAS(cublasGemmEx(blas, CUBLAS_OP_N, o.trans_b, o.m, o.n, o.k, &alpha, a, CUDA_R_16BF,
                                o.lda, b, CUDA_R_16BF, o.ldb, &o.beta, c, CUDA_R_32F, o.ldc,
                                CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    } else {
      CHECK_CUBLAS(cublasLtMatmul(lt, desc, &alpha, a, la, b, lb, &o.beta, c, lc, c, lc,
                                  &found[entry - 1].algo, workspace, flags.workspace, stream));
    }
  };
  const int entries = 1 + count;
  std::vector<std::vector<double>> ms(entries);
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  for (int e = 0; e < entries; ++e) launch(e);  // warm-up: every kernel loaded
  for (int r = 0; r < flags.rounds; ++r) {
    for (int i = 0; i < entries; ++i) {
      const int e = r % 2 ? entries - 1 - i : i;  // each order's warmth shared out
      CHECK_CUDA(cudaEventRecord(start, stream));
      for (int l = 0; l < flags.launches; ++l) launch(e);
      CHECK_CUDA(cudaEventRecord(stop, stream));
      CHECK_CUDA(cudaEventSynchronize(stop));
      float t = 0;
      CHECK_CUDA(cudaEventElapsedTime(&t, start, stop));
      ms[e].push_back(t / flags.launches);
    }
  }
  const double flop = 2.0 * o.m * o.n * o.k;
  const double base = Median(ms[0]);
  std::printf("== %s rows=%lld H=%lld cols=%lld: %d heuristic algorithms\n", p.gemm.c_str(),
              static_cast<long long>(p.rows), static_cast<long long>(p.hidden),
              static_cast<long long>(p.cols), count);
  nlohmann::json rec = {{"gemm", p.gemm},         {"rows", p.rows},
                        {"hidden", p.hidden},     {"cols", p.cols},
                        {"rounds", flags.rounds}, {"launches", flags.launches},
                        {"default_ms", base},     {"default_round_ms", ms[0]}};
  std::printf("  cublasGemmEx default   %8.3f ms  %5.0f TFLOP/s\n", base, flop / base * 1e-9);
  nlohmann::json algos = nlohmann::json::array();
  for (int i = 0; i < count; ++i) {
    const cublasLtMatmulAlgo_t& algo = found[i].algo;
    const double med = Median(ms[i + 1]);
    nlohmann::json a_rec = flce::bench::DescribeAlgo(algo);
    a_rec.update({{"heuristic_rank", i},
                  {"workspace_bytes", found[i].workspaceSize},
                  {"ms", med},
                  {"ratio_to_default", med / base},
                  {"round_ms", ms[i + 1]}});
    std::printf(
        "  heuristic #%-2d id %3d tile %3u stages %3u cluster %2u splitk %d  %8.3f ms  %5.0f "
        "TFLOP/s  %.3fx default\n",
        i, a_rec["algo_id"].get<int>(), a_rec["tile"].get<unsigned>(),
        a_rec["stages"].get<unsigned>(), a_rec["cluster"].get<unsigned>(),
        a_rec["splitk"].get<int>(), med, flop / med * 1e-9, med / base);
    algos.push_back(a_rec);
  }
  rec["algos"] = algos;
  CHECK_CUDA(cudaEventDestroy(start));
  CHECK_CUDA(cudaEventDestroy(stop));
  CHECK_CUBLAS(cublasLtMatmulPreferenceDestroy(pref));
  CHECK_CUBLAS(cublasLtMatrixLayoutDestroy(la));
  CHECK_CUBLAS(cublasLtMatrixLayoutDestroy(lb));
  CHECK_CUBLAS(cublasLtMatrixLayoutDestroy(lc));
  CHECK_CUBLAS(cublasLtMatmulDescDestroy(desc));
  CHECK_CUDA(cudaFree(a));
  CHECK_CUDA(cudaFree(b));
  CHECK_CUDA(cudaFree(c));
  return rec;
}

}  // namespace

int main(int argc, char** argv) {
  const Flags flags = ParseFlags(argc, argv);
  int device_count = 0;
  if (cudaGetDeviceCount(&device_count) != cudaSuccess || device_count == 0) {
    std::fprintf(stderr, "flce_gemm_algo_bench: no CUDA device\n");
    return 1;
  }
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreate(&stream));
  cublasHandle_t blas;
  CHECK_CUBLAS(cublasCreate(&blas));
  CHECK_CUBLAS(cublasSetStream(blas, stream));
  cublasLtHandle_t lt;
  CHECK_CUBLAS(cublasLtCreate(&lt));
  void* workspace = nullptr;
  CHECK_CUDA(cudaMalloc(&workspace, flags.workspace));
  nlohmann::json records = nlohmann::json::array();
  char date[16];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof(date), "%Y-%m-%d", std::gmtime(&now));
  for (const Problem& p : flags.problems) {
    nlohmann::json rec = RunProblem(flags, p, blas, lt, stream, workspace);
    rec["gpu"] = prop.name;
    rec["date"] = date;
    rec["commit"] = flags.commit;
    records.push_back(rec);
  }
  if (!flags.out.empty()) {
    std::ofstream(flags.out) << records.dump(1) << "\n";
    std::printf("wrote %s\n", flags.out.c_str());
  }
  CHECK_CUDA(cudaFree(workspace));
  CHECK_CUBLAS(cublasLtDestroy(lt));
  CHECK_CUBLAS(cublasDestroy(blas));
  CHECK_CUDA(cudaStreamDestroy(stream));
  return 0;
}
