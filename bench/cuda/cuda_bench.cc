// flce_cuda_bench: the CUDA engine's plans at the shapes (bf16, 5% of
// targets ignored, MATH.md random data generated on the device, inputs
// already on the device), each timed with CUDA events (median of --runs after
// --warmup), next to the three-GEMM bound: cuBLAS running only the chunked
// plan's three GEMMs over the whole problem in 8192-token chunks (bf16
// operands, fp32 accumulation, bf16 logits, grad_W into an fp32 accumulator
// with beta = 1, V padded to 128) in the same process.
//
// Usage:
//   flce_cuda_bench --out=bench/results/cuda-2026-11-29.json --commit=$(git rev-parse HEAD)
//   flce_cuda_bench --shapes=2 --strategies=chunked,vocab_split --runs=5
//   flce_cuda_bench --stages=0 --strategies=chunked,chunked@FLCE_CUDA_STATS_GROUP=16
//     (NAME@VAR=VALUE: strategy NAME with an engine switch set for its runs, to
//     alternate a variant with the default in one process; NAME@A=1@B=2 sets two)
//   flce_cuda_bench --stages=0 --interleave --runs=9 --strategies=chunked,chunked@VAR=VALUE
//     (rounds of one call each, bound included, in orders that give every
//     entry every place and every predecessor equally often, bench/round_order.h:
//     a later place in a series runs on a warmer GPU, which back-to-back
//     series charge to whichever entry runs later)
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "bench/cuda/bench_data.cuh"
#include "bench/cuda/best_algo_bound.h"
#include "bench/cuda/gpu_energy.h"
#include "bench/cuda/quack_rebuild.cuh"
#include "bench/round_order.h"
#include "kernels/cuda/base/policy.h"
#include "kernels/cuda/base/stage_timer.h"
#include "kernels/cuda/engine/cuda_engine.h"
#include "kernels/cuda/ops/cluster_row_kernel.cuh"
#include "kernels/cuda/ops/fused_row_kernel.cuh"
#include "kernels/cuda/ops/gemm.h"
#include "kernels/cuda/ops/row_scaled_backward.cuh"
#include "kernels/cuda/ops/sm90/backward_gemm.cuh"
#include "kernels/cuda/ops/sm90/logits_stats_gemm.cuh"
#include "kernels/cuda/ops/tile_stats_kernels.cuh"
#include "kernels/cuda/plans/kernel_report.h"
#include "kernels/cuda/plans/plan_parts.h"
#include "nlohmann/json.hpp"

namespace flce::bench {
namespace {

using cuda::CudaEngine;
using cuda::CudaGradBuffer;
using cuda::CudaHead;
using cuda::DeviceBuffer;
using cuda::DeviceRequest;
using cuda::Plan;
using cuda::PlanRequest;

struct Shape {
  int64_t bt, h, v;
};

constexpr char kQuackRebuild[] = "cublas_quack_rebuild";
constexpr char kBestAlgoBound[] = "gemm_bound_best_algos";
// 0-2: the shapes (the default); 3, 4: heads of H 2048 and 1536, between
// the first shape's H and the others' (--shapes=3,4); 5, 6: heads of H 3072 and
// 8192 (3B- and 70B-class), on either side of H = 4096 (--shapes=5,6); 7: an 8B-class
// head at 32768 tokens, the largest shape of the served-step measurements (--shapes=7);
// 8: the shape QuACK and Liger-Kernel publish their H200 times at (--shapes=8).
constexpr Shape kShapes[] = {{65535, 1024, 176245}, {16384, 4096, 151936}, {8192, 4096, 128256},
                             {32768, 2048, 128256}, {32768, 1536, 151936}, {16384, 3072, 128256},
                             {8192, 8192, 128256},  {32768, 4096, 128256}, {4096, 4096, 128256}};
constexpr int kShapeCount = static_cast<int>(sizeof(kShapes) / sizeof(kShapes[0]));

struct Flags {
  std::string out;
  std::string commit = "unknown";
  int runs = 5;
  int warmup = 1;
  int64_t workspace_mb = 2048;
  int64_t wall_mb = 0;  // > 0: naive/separate refused at the budget also run with this one
  int64_t fuse_mn_tokens = 1024;
  bool stages = true;  // per-stage times of one chunked chunk
  // Rounds of one call each of the bound and every strategy (in
  // RoundOrder's balanced orders) instead of each one's runs back to back:
  // the ratio is then each round's against the bound of the same round.
  bool interleave = false;
  std::vector<int> shapes = {0, 1, 2};
  // chunked_cluster / chunked_two_pass: the chunked plan with one row
  // kernel forced (FLCE_CUDA_ROW_KERNEL), to compare them.
  // chunked_overlap: FLCE_CUDA_OVERLAP=1 (row kernel beside the GEMMs).
  // chunked_cublas: the chunked plan on the fp32-logits cuBLAS path
  // (FLCE_CUDA_LOGITS=cublas), as on non-Hopper GPUs or with a softcap;
  // the three variants above also run on that path.
  // chunked_cublas_backward / chunked_own_backward: the default plan with
  // both backward GEMMs on cuBLAS / on the own Hopper kernels
  // (FLCE_CUDA_BACKWARD=cublas / own) instead of the default choice.
  // chunked_entropy / chunked_accuracy: the default plan for a call that
  // asks for per-token entropy / for entropy and accuracy (the GEMM's tile
  // max and sez sum / and the argmax); every other entry is a call for the
  // loss, per-token loss and logprob and the gradients only.
  // cublas_quack_rebuild: not the engine but QuACK v0.6.1's pipeline rebuilt
  // with cuBLAS (bench/cuda/quack_rebuild.cuh), checked against float64 once
  // per process before it is timed; not in the default list.
  // gemm_bound_best_algos: the three-GEMM bound's products in 8192-token
  // chunks, each with the fastest of cuBLASLt's heuristic algorithms
  // (bench/cuda/best_algo_bound.h), checked on sampled entries; not in the
  // default list.
  // NAME@VAR=VALUE (e.g. chunked@FLCE_CUDA_STATS_GROUP=16): strategy NAME
  // with an engine switch set for its runs; NAME@A=1@B=2 sets two.
  std::vector<std::string> strategies = {"chunked",
                                         "chunked_entropy",
                                         "chunked_accuracy",
                                         "chunked_cublas_backward",
                                         "chunked_own_backward",
                                         "chunked_cublas",
                                         "chunked_cluster",
                                         "chunked_two_pass",
                                         "chunked_overlap",
                                         "vocab_split",
                                         "fuse_mn",
                                         "separate",
                                         "naive",
                                         "auto"};
};

bool ParseFlags(int argc, char** argv, Flags* f) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto val = [&](const char* name) -> const char* {
      std::string p = std::string("--") + name + "=";
      return a.rfind(p, 0) == 0 ? argv[i] + p.size() : nullptr;
    };
    if (const char* v = val("out"))
      f->out = v;
    else if (const char* v = val("commit"))
      f->commit = v;
    else if (const char* v = val("runs"))
      f->runs = std::atoi(v);
    else if (const char* v = val("warmup"))
      f->warmup = std::atoi(v);
    else if (const char* v = val("workspace-mb"))
      f->workspace_mb = std::atoll(v);
    else if (const char* v = val("wall-mb"))
      f->wall_mb = std::atoll(v);
    else if (const char* v = val("fuse-mn-tokens"))
      f->fuse_mn_tokens = std::atoll(v);
    else if (const char* v = val("stages"))
      f->stages = std::string(v) != "0";
    else if (a == "--interleave")
      f->interleave = true;
    else if (const char* v = val("shapes")) {
      f->shapes.clear();
      for (absl::string_view s : absl::StrSplit(v, ',')) {
        int x;
        if (!absl::SimpleAtoi(s, &x) || x < 0 || x >= kShapeCount) return false;
        f->shapes.push_back(x);
      }
    } else if (const char* v = val("strategies")) {
      f->strategies = absl::StrSplit(v, ',');
    } else {
      std::fprintf(stderr, "unknown flag %s\n", argv[i]);
      return false;
    }
  }
  return f->runs >= 1;
}

Strategy ParseStrategy(const std::string& s) {
  for (Strategy x : {Strategy::kAuto, Strategy::kChunked, Strategy::kVocabSplit, Strategy::kFuseMN,
                     Strategy::kSeparate, Strategy::kNaive}) {
    if (s == StrategyName(x)) return x;
  }
  return Strategy::kAuto;
}

#define CHECK_CUDA(expr)                                                                         \
  do {                                                                                           \
    cudaError_t e_ = (expr);                                                                     \
    if (e_ != cudaSuccess) {                                                                     \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(e_)); \
      return 1;                                                                                  \
    }                                                                                            \
  } while (0)
#define CHECK_CUBLAS(expr)                                              \
  do {                                                                  \
    cublasStatus_t s_ = (expr);                                         \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                  \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #expr, \
                   cublasGetStatusString(s_));                          \
      return 1;                                                         \
    }                                                                   \
  } while (0)

constexpr double kMinEnergyWindowS = 1.0;

// ", 12.3 J per run" where the energy was measured, else nothing.
std::string Joules(double joules) {
  if (joules < 0) return "";
  char text[48];
  std::snprintf(text, sizeof(text), ", %.1f J per run", joules);
  return text;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

// Median of `runs` timed calls of fn (after `warmup` untimed ones), CUDA
// events on `stream`. fn returns false on failure. With `energy`, *joules is
// the GPU's energy per timed call, the counter read around all of them; -1
// when they took less than kMinEnergyWindowS (the counter moves in steps too
// coarse for a shorter series; docs/perf/cuda.md).
double TimeMedian(cudaStream_t stream, int warmup, int runs, const std::function<bool()>& fn,
                  const GpuEnergy* energy = nullptr, double* joules = nullptr) {
  for (int i = 0; i < warmup; ++i) {
    if (!fn()) return -1.0;
  }
  if (cudaStreamSynchronize(stream) != cudaSuccess) return -1.0;
  const std::optional<uint64_t> mj0 = energy != nullptr ? energy->MilliJoules() : std::nullopt;
  const auto start = std::chrono::steady_clock::now();
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  std::vector<double> ms;
  for (int i = 0; i < runs; ++i) {
    cudaEventRecord(a, stream);
    if (!fn()) return -1.0;
    cudaEventRecord(b, stream);
    cudaEventSynchronize(b);
    float t = 0;
    cudaEventElapsedTime(&t, a, b);
    ms.push_back(t);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  if (joules != nullptr) {
    const std::optional<uint64_t> mj1 = mj0.has_value() ? energy->MilliJoules() : std::nullopt;
    const std::chrono::duration<double> window = std::chrono::steady_clock::now() - start;
    *joules = mj1.has_value() && window.count() >= kMinEnergyWindowS ? (*mj1 - *mj0) / 1000.0 / runs
                                                                     : -1.0;
  }
  return Median(std::move(ms));
}

// `runs` rounds (after `warmup` untimed ones) of one call of each fn, in
// RoundOrder's balanced orders, each call timed with CUDA events:
// times[f][round]. False when a call fails.
bool TimeRounds(cudaStream_t stream, int warmup, int runs,
                const std::vector<std::function<bool()>>& fns,
                std::vector<std::vector<double>>* times) {
  const size_t n = fns.size();
  times->assign(n, {});
  cudaEvent_t a, b;
  if (cudaEventCreate(&a) != cudaSuccess || cudaEventCreate(&b) != cudaSuccess) return false;
  bool ok = true;
  for (int round = -warmup; round < runs && ok; ++round) {
    const std::vector<size_t> order = bench::RoundOrder(n, static_cast<size_t>(round + warmup));
    for (size_t j = 0; j < n && ok; ++j) {
      const size_t f = order[j];
      ok = cudaEventRecord(a, stream) == cudaSuccess && fns[f]() &&
           cudaEventRecord(b, stream) == cudaSuccess && cudaEventSynchronize(b) == cudaSuccess;
      float t = 0;
      if (ok && round >= 0) {
        ok = cudaEventElapsedTime(&t, a, b) == cudaSuccess;
        (*times)[f].push_back(t);
      }
    }
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return ok;
}

// Median of `reps` timed runs of fn after one untimed run, each preceded by
// an untimed setup (which recreates what fn consumes); -1 on failure.
double TimeStage(cudaStream_t stream, int reps, const std::function<bool()>& setup,
                 const std::function<bool()>& fn) {
  std::vector<double> ms;
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  double result = -1.0;
  for (int i = 0; i < reps + 1; ++i) {
    if (setup && !setup()) break;
    cudaEventRecord(a, stream);
    if (!fn()) break;
    cudaEventRecord(b, stream);
    cudaEventSynchronize(b);
    float t = 0;
    cudaEventElapsedTime(&t, a, b);
    if (i > 0) ms.push_back(t);
  }
  if (static_cast<int>(ms.size()) == reps) {
    std::sort(ms.begin(), ms.end());
    result = ms[ms.size() / 2];
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return result;
}

// Times each stage of one chunk of the chunked plan on its own (median of
// `reps`, CUDA events): where the time above the three-GEMM bound goes.
nlohmann::json StageBreakdown(CudaEngine& engine, const CudaHead& head, const Plan& plan,
                              const DeviceRequest& req, int reps) {
  nlohmann::json out;
  const cuda::HeadView hv = head.view();
  const int64_t rows = std::min(plan.chunk_tokens, req.rows);
  std::lock_guard<std::mutex> lock(engine.submit_mutex());
  auto scratch = engine.Scratch(plan.scratch_bytes, "stage breakdown");
  if (!scratch.ok()) return out;
  float* logits = reinterpret_cast<float*>(*scratch);
  cudaStream_t stream = engine.compute_stream();
  const cuda::Gemm gemm = cuda::plan_parts::MakeGemm(engine.exec(), hv);  // as the plans run them
  cuda::FusedRowArgs args;
  args.logits = logits;
  args.ld_logits = hv.padded_vocab;
  args.padded_vocab = hv.padded_vocab;
  args.rows = rows;
  args.dlogits = logits;
  args.dlogits_row_bytes = hv.padded_vocab * 4;
  args.in = req.in;
  args.out = req.out;
  args.params = req.params;
  auto logits_gemm = [&]() {
    return gemm
        .Logits(req.hidden, hv.weight, rows, hv.padded_vocab, hv.hidden, logits, hv.padded_vocab)
        .ok();
  };
  auto time_with_setup = [&](const std::function<bool()>& setup, const std::function<bool()>& fn) {
    return TimeStage(stream, reps, setup, fn);
  };
  const int64_t ld_d = hv.padded_vocab * 4 / DTypeSize(hv.dtype);
  out["chunk_tokens"] = rows;
  out["logits_gemm_fp32_ms"] = time_with_setup(nullptr, logits_gemm);
  out["row_kernel_cluster_ms"] = time_with_setup(logits_gemm, [&]() {
    return cuda::LaunchClusterRows(hv.dtype, args, stream, gemm.health).ok();
  });
  out["row_kernel_two_pass_ms"] = time_with_setup(logits_gemm, [&]() {
    return cuda::LaunchFusedRows(hv.dtype, args, stream, gemm.health).ok();
  });
  out["grad_input_gemm_ms"] = time_with_setup(nullptr, [&]() {
    return gemm
        .GradInput(logits, ld_d, hv.weight, rows, hv.padded_vocab, hv.hidden, req.grad_input,
                   hv.dtype, 0.0f)
        .ok();
  });
  out["grad_weight_gemm_ms"] = time_with_setup(nullptr, [&]() {
    return gemm
        .GradWeight(logits, ld_d, req.hidden, rows, hv.padded_vocab, hv.hidden, req.grad_weight)
        .ok();
  });
  return out;
}

// fn run back to back for at least kSustainedS (after a quarter of that
// untimed): time and energy per call once the GPU sits at its power limit,
// as the kernels of a whole run do. Null where a call fails.
nlohmann::json Sustained(cudaStream_t stream, const std::function<bool()>& fn,
                         const GpuEnergy& energy) {
  constexpr double kSustainedS = 2.0;
  const double once_ms = TimeStage(stream, 1, nullptr, fn);
  if (once_ms <= 0) return nullptr;
  const int calls = static_cast<int>(std::ceil(kSustainedS * 1e3 / once_ms));
  for (int i = 0; i < calls / 4; ++i) {
    if (!fn()) return nullptr;
  }
  double joules = -1.0;
  const double ms = TimeMedian(
      stream, 0, 1,
      [&]() {
        for (int i = 0; i < calls; ++i) {
          if (!fn()) return false;
        }
        return true;
      },
      &energy, &joules);
  if (ms < 0) return nullptr;
  nlohmann::json out = {{"calls", calls}, {"ms_per_call", ms / calls}};
  if (joules >= 0) {
    out["joules_per_call"] = joules / calls;
    out["watts"] = joules / (ms * 1e-3);
  }
  return out;
}

// The same for the logits-stats path: its GEMM (with the row partials in
// the epilogue), the row finish, the dlogits pass and the two cuBLAS GEMMs.
// With `energy`, also every GEMM sustained (Sustained): the stats GEMM,
// cuBLAS's logits GEMM with a 16-bit output (the bound's first GEMM: the same
// flops and output bytes) and both backward GEMMs, cuBLAS's and the own ones.
nlohmann::json TileStageBreakdown(CudaEngine& engine, const CudaHead& head, const Plan& plan,
                                  const DeviceRequest& req, int reps, const GpuEnergy* energy) {
  nlohmann::json out;
  const cuda::HeadView hv = head.view();
  const int64_t rows = std::min(plan.chunk_tokens, req.rows);
  std::lock_guard<std::mutex> lock(engine.submit_mutex());
  auto scratch = engine.Scratch(plan.scratch_bytes, "stage breakdown");
  if (!scratch.ok()) return out;
  DeviceRequest chunk = req;
  chunk.rows = rows;
  auto launch = cuda::PrepareTileChunk(engine.exec(), hv, plan, chunk, *scratch);
  if (!launch.ok()) return out;
  const cuda::LogitsStatsArgs& g = launch->gemm;
  const cuda::TileRowArgs& t = launch->rows;
  void* e = g.exp_out;
  cudaStream_t stream = engine.compute_stream();
  cuda::DeviceHealth* health = engine.context()->health();
  const cuda::Gemm gemm = cuda::plan_parts::MakeGemm(engine.exec(), hv);  // as the plans run them
  auto stats_gemm = [&]() { return cuda::LaunchLogitsStats(hv.dtype, g, stream, health).ok(); };
  // The row-scaled backward's variant (bf16 heads): bf16 exp(z - M_t) after
  // the reference GEMV; the default path's GEMM.
  cuda::LogitsStatsArgs row_scaled = g;
  row_scaled.row_reference = launch->row_reference;
  auto row_scaled_gemm = [&]() {
    return cuda::LaunchLogitsStats(hv.dtype, row_scaled, stream, health).ok();
  };
  auto finish = [&]() { return cuda::LaunchTileFinish(t, stream, health).ok(); };
  auto gemm_and_finish = [&]() { return stats_gemm() && finish(); };
  auto time_with_setup = [&](const std::function<bool()>& setup, const std::function<bool()>& fn) {
    return TimeStage(stream, reps, setup, fn);
  };
  out["chunk_tokens"] = rows;
  out["logits_stats_gemm_ms"] = time_with_setup(nullptr, stats_gemm);
  if (launch->row_reference != nullptr) {
    out["row_reference_ms"] = time_with_setup(nullptr, [&]() {
      return cuda::LaunchRowReference(hv.dtype, g.x, g.w, g.target, rows, hv.hidden,
                                      launch->row_reference, launch->fallback, stream, health)
          .ok();
    });
    out["logits_stats_gemm_row_scaled_ms"] = time_with_setup(nullptr, row_scaled_gemm);
  }
  out["row_finish_ms"] = time_with_setup(stats_gemm, finish);
  out["dlogits_pass_ms"] = time_with_setup(
      gemm_and_finish, [&]() { return cuda::LaunchTileGrad(hv.dtype, t, stream, health).ok(); });
  const std::function<bool()> grad_input_gemm = [&]() {
    return gemm
        .GradInput(e, hv.padded_vocab, hv.weight, rows, hv.padded_vocab, hv.hidden, req.grad_input,
                   hv.dtype, 0.0f)
        .ok();
  };
  const std::function<bool()> grad_weight_gemm = [&]() {
    return gemm
        .GradWeight(e, hv.padded_vocab, req.hidden, rows, hv.padded_vocab, hv.hidden,
                    req.grad_weight)
        .ok();
  };
  out["grad_input_gemm_ms"] = time_with_setup(nullptr, grad_input_gemm);
  out["grad_weight_gemm_ms"] = time_with_setup(nullptr, grad_weight_gemm);
  // The own Hopper kernels for the same two products (fp32 grad_input slabs,
  // as the row-scaled path takes them), and each GEMM's rate.
  const double tflop = 2.0 * rows * hv.padded_vocab * hv.hidden * 1e-12;
  auto rate = [&](const char* key) {
    const double ms = out[key].get<double>();
    return ms > 0 ? tflop / (ms * 1e-3) : 0.0;
  };
  out["grad_input_gemm_tflops"] = rate("grad_input_gemm_ms");
  out["grad_weight_gemm_tflops"] = rate("grad_weight_gemm_ms");
  std::function<bool()> own_grad_input, own_grad_weight, own_grad_weight_cooperative;
  cuda::GradWeightGemmArgs gw, gw_cooperative;
  if (cuda::BackwardGemmSupported(hv.dtype, hv.hidden) && launch->own_grad_input.out != nullptr) {
    const cuda::GradInputGemmArgs* gi = &launch->own_grad_input;
    out["own_grad_input_splits"] = gi->splits;
    own_grad_input = [&, gi]() {
      return cuda::LaunchGradInputGemm(hv.dtype, *gi, stream, health).ok();
    };
    gw.d = e;
    gw.x = req.hidden;
    gw.rows = rows;
    gw.cols = hv.padded_vocab;
    gw.hidden = hv.hidden;
    gw.gw = req.grad_weight;
    own_grad_weight = [&]() {
      return cuda::LaunchGradWeightGemm(hv.dtype, gw, stream, health).ok();
    };
    gw_cooperative = gw;
    gw_cooperative.kernel = cuda::GradWeightKernel::kCooperative;
    own_grad_weight_cooperative = [&]() {
      return cuda::LaunchGradWeightGemm(hv.dtype, gw_cooperative, stream, health).ok();
    };
    out["own_grad_input_gemm_ms"] = time_with_setup(nullptr, own_grad_input);
    out["own_grad_weight_gemm_ms"] = time_with_setup(nullptr, own_grad_weight);
    out["own_grad_weight_cooperative_gemm_ms"] =
        time_with_setup(nullptr, own_grad_weight_cooperative);
    out["own_grad_input_gemm_tflops"] = rate("own_grad_input_gemm_ms");
    out["own_grad_weight_gemm_tflops"] = rate("own_grad_weight_gemm_ms");
    out["own_grad_weight_cooperative_gemm_tflops"] = rate("own_grad_weight_cooperative_gemm_ms");
  }
  if (energy != nullptr && hv.dtype == DType::kBF16) {
    const float one = 1.0f, zero = 0.0f;
    const int n = static_cast<int>(hv.padded_vocab), m = static_cast<int>(rows),
              k = static_cast<int>(hv.hidden);
    if (cublasSetStream(gemm.handle, stream) != CUBLAS_STATUS_SUCCESS) return out;
    out["sustained_logits_stats_gemm"] = Sustained(stream, stats_gemm, *energy);
    if (launch->row_reference != nullptr) {
      // For the default call (neither entropy nor accuracy: the statistics
      // around M_t), one asking for entropy (the tile max and the sez sum)
      // and one asking for both (the argmax too).
      struct Variant {
        const char* key;
        bool entropy, argmax;
      };
      for (const Variant& v :
           {Variant{"sustained_logits_stats_gemm_row_scaled", false, false},
            Variant{"sustained_logits_stats_gemm_row_scaled_entropy", true, false},
            Variant{"sustained_logits_stats_gemm_row_scaled_argmax", true, true}}) {
        row_scaled.entropy = v.entropy;
        row_scaled.argmax = v.argmax;
        out[v.key] = Sustained(stream, row_scaled_gemm, *energy);
      }
    }
    out["sustained_cublas_logits_gemm_bf16"] = Sustained(
        stream,
        [&]() {
          return cublasGemmEx(gemm.handle, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &one, hv.weight,
                              CUDA_R_16BF, k, g.x, CUDA_R_16BF, k, &zero, e, CUDA_R_16BF, n,
                              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS;
        },
        *energy);
    out["sustained_grad_input_gemm"] = Sustained(stream, grad_input_gemm, *energy);
    out["sustained_grad_weight_gemm"] = Sustained(stream, grad_weight_gemm, *energy);
    if (own_grad_input) {
      out["sustained_own_grad_input_gemm"] = Sustained(stream, own_grad_input, *energy);
      out["sustained_own_grad_weight_gemm"] = Sustained(stream, own_grad_weight, *energy);
      out["sustained_own_grad_weight_cooperative_gemm"] =
          Sustained(stream, own_grad_weight_cooperative, *energy);
    }
  }
  return out;
}

// The whole request through `plan` with the end of every stage marked
// (cuda::StageTimer): per-stage totals of a sustained run, median over
// `runs` after one warm-up, next to the run's wall time. `backward` is
// FLCE_CUDA_BACKWARD for the run (null: the plan's choice).
nlohmann::json PipelineStages(CudaEngine& engine, const CudaHead& head, const Plan& plan,
                              const DeviceRequest& req, int runs, const char* backward) {
  nlohmann::json out;
  std::lock_guard<std::mutex> lock(engine.submit_mutex());
  auto scratch = engine.Scratch(plan.scratch_bytes, "pipeline stages");
  if (!scratch.ok()) return out;
  Plan run_plan = plan;
  if (backward != nullptr) {
    setenv("FLCE_CUDA_BACKWARD", backward, 1);
    run_plan.switches = cuda::KernelSwitchesFromEnvironment();
    unsetenv("FLCE_CUDA_BACKWARD");
  }
  cuda::StageTimer timer;
  cuda::Exec exec = engine.exec();
  exec.timer = &timer;
  std::map<std::string, std::vector<double>> per_stage;
  std::vector<double> walls;
  for (int i = 0; i < runs + 1; ++i) {
    timer.Begin(exec.stream);
    if (!cuda::RunPlan(exec, head.view(), run_plan, req, *scratch).ok()) break;
    timer.Mark(exec.stream, "(end)");
    if (cudaStreamSynchronize(exec.stream) != cudaSuccess) break;
    if (i == 0) continue;
    double wall = 0.0;
    for (const auto& [name, ms] : timer.Totals()) {
      per_stage[name].push_back(ms);
      wall += ms;
    }
    walls.push_back(wall);
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? -1.0 : v[v.size() / 2];
  };
  for (const auto& [name, v] : per_stage) {
    if (name != "(end)") out[name] = median(v);
  }
  out["wall_ms"] = median(walls);
  out["backward"] = backward != nullptr ? backward : "default";
  return out;
}

std::string Today() {
  std::time_t now = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d", std::gmtime(&now));
  return buf;
}

int Main(int argc, char** argv) {
  Flags flags;
  if (!ParseFlags(argc, argv, &flags)) {
    std::fprintf(stderr, "bad flags\n");
    return 2;
  }
  EngineConfig config;
  config.workspace_bytes = flags.workspace_mb << 20;
  auto engine_or = CudaEngine::Create(config);
  if (!engine_or.ok()) {
    std::fprintf(stderr, "CUDA engine: %s\n", engine_or.status().ToString().c_str());
    return 1;
  }
  std::unique_ptr<CudaEngine> engine = std::move(*engine_or);
  std::unique_ptr<CudaEngine> wall;
  if (flags.wall_mb > 0) {
    EngineConfig wc;
    wc.workspace_bytes = flags.wall_mb << 20;
    auto w = CudaEngine::Create(wc);
    if (w.ok()) wall = std::move(*w);
  }
  const std::string gpu = engine->info().name;
  const std::string date = Today();
  cudaStream_t stream = engine->compute_stream();
  cublasHandle_t cublas;
  CHECK_CUBLAS(cublasCreate(&cublas));
  CHECK_CUBLAS(cublasSetStream(cublas, stream));
  cublasLtHandle_t lt;
  CHECK_CUBLAS(cublasLtCreate(&lt));
  nlohmann::json records = nlohmann::json::array();
  bool quack_checked = false;

  std::string energy_why;
  const std::optional<GpuEnergy> energy = GpuEnergy::ForCurrentDevice(&energy_why);
  if (!energy.has_value()) std::printf("# GPU energy not measured: %s\n", energy_why.c_str());
  const GpuEnergy* energy_ptr = energy.has_value() ? &*energy : nullptr;
  for (int si : flags.shapes) {
    const Shape sh = kShapes[si];
    const int64_t vp = cuda::PadVocab(sh.v);
    std::printf("== BT=%lld H=%lld V=%lld (padded %lld), bf16\n", (long long)sh.bt, (long long)sh.h,
                (long long)sh.v, (long long)vp);
    // Inputs on the device.
    HeadSpec hs{sh.v, sh.h, DType::kBF16, false};
    auto wbuf = DeviceBuffer::Allocate(vp * sh.h * 2, engine->context()->health());
    auto xbuf = DeviceBuffer::Allocate(sh.bt * sh.h * 2, engine->context()->health());
    auto gibuf = DeviceBuffer::Allocate(sh.bt * sh.h * 2, engine->context()->health());
    auto rowbuf = DeviceBuffer::Allocate(sh.bt * 4 * 8, engine->context()->health());
    if (!wbuf.ok() || !xbuf.ok() || !gibuf.ok() || !rowbuf.ok()) {
      std::fprintf(stderr, "allocation failed\n");
      return 1;
    }
    CHECK_CUDA(cudaMemsetAsync(wbuf->get(), 0, wbuf->bytes(), stream));
    CHECK_CUDA(
        FillNormalBf16(wbuf->get(), sh.v * sh.h, 1.0f / std::sqrt(float(sh.h)), 1234 + si, stream));
    CHECK_CUDA(FillNormalBf16(xbuf->get(), sh.bt * sh.h, 1.0f, 777 + si, stream));
    int32_t* target = static_cast<int32_t*>(rowbuf->get());
    float* a = reinterpret_cast<float*>(target + sh.bt);
    float* e = a + sh.bt;
    float* outs = e + sh.bt;
    CHECK_CUDA(FillTargets(target, sh.bt, sh.v, 0.05f, 99 + si, stream));
    std::vector<int32_t> host_t(sh.bt);
    CHECK_CUDA(cudaMemcpyAsync(host_t.data(), target, sh.bt * 4, cudaMemcpyDeviceToHost, stream));
    CHECK_CUDA(cudaStreamSynchronize(stream));
    const int64_t n_valid =
        std::count_if(host_t.begin(), host_t.end(), [](int32_t y) { return y >= 0; });
    CHECK_CUDA(FillTokenWeights(a, target, sh.bt, 1.0f / n_valid, stream));
    CHECK_CUDA(FillConstant(e, sh.bt, 0.0f, stream));
    CHECK_CUDA(cudaStreamSynchronize(stream));
    auto head =
        std::make_shared<CudaHead>(engine->shared_context(), hs, std::move(*wbuf), DeviceBuffer());
    auto grad_or = engine->NewGradBuffer(hs);
    if (!grad_or.ok()) {
      std::fprintf(stderr, "grad buffer: %s\n", grad_or.status().ToString().c_str());
      return 1;
    }
    auto* grad = static_cast<CudaGradBuffer*>(grad_or->get());

    DeviceRequest req;
    req.rows = sh.bt;
    req.hidden_dtype = DType::kBF16;
    req.hidden = xbuf->get();
    req.in.target = target;
    req.in.token_weight = a;
    req.in.entropy_weight = e;
    req.out.loss = outs;
    req.out.z_loss = outs + sh.bt;
    req.out.logprob = outs + 2 * sh.bt;
    // A training call that asks for neither entropy nor accuracy computes
    // neither; chunked_entropy and chunked_accuracy are the same plan with them.
    float* entropy_out = outs + 3 * sh.bt;
    int32_t* argmax = reinterpret_cast<int32_t*>(outs + 4 * sh.bt);
    req.grad_input = gibuf->get();
    req.grad_weight = grad->weight();
    req.params.vocab = sh.v;

    // The three-GEMM bound: 8192-token chunks (a 2.9 GB logits buffer at the
    // first shape), and the same GEMMs at the default plan's chunk size, which
    // its 2 GiB workspace sets (smaller GEMMs fill the GPU's waves less well).
    double bound_ms;
    double bound_joules = -1.0;
    double bound_at_plan_chunk_ms = -1.0;
    int64_t plan_chunk = 0;
    constexpr int64_t kChunk = 8192;
    auto lbuf = DeviceBuffer::Allocate(kChunk * vp * 2, engine->context()->health());
    if (!lbuf.ok()) {
      std::fprintf(stderr, "bound logits buffer: %s\n", lbuf.status().ToString().c_str());
      return 1;
    }
    const void* w = head->view().weight;
    const auto bound_step = [&](int64_t chunk) {
      const float one = 1.0f, zero = 0.0f;
      for (int64_t c0 = 0; c0 < sh.bt; c0 += chunk) {
        const int rows = static_cast<int>(std::min(chunk, sh.bt - c0));
        const char* x = static_cast<const char*>(xbuf->get()) + c0 * sh.h * 2;
        char* gi = static_cast<char*>(gibuf->get()) + c0 * sh.h * 2;
        if (cublasGemmEx(cublas, CUBLAS_OP_T, CUBLAS_OP_N, vp, rows, sh.h, &one, w, CUDA_R_16BF,
                         sh.h, x, CUDA_R_16BF, sh.h, &zero, lbuf->get(), CUDA_R_16BF, vp,
                         CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS ||
            cublasGemmEx(cublas, CUBLAS_OP_N, CUBLAS_OP_N, sh.h, rows, vp, &one, w, CUDA_R_16BF,
                         sh.h, lbuf->get(), CUDA_R_16BF, vp, &zero, gi, CUDA_R_16BF, sh.h,
                         CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS ||
            cublasGemmEx(cublas, CUBLAS_OP_N, CUBLAS_OP_T, sh.h, vp, rows, &one, x, CUDA_R_16BF,
                         sh.h, lbuf->get(), CUDA_R_16BF, vp, &one, grad->weight(), CUDA_R_32F, sh.h,
                         CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS) {
          return false;
        }
      }
      return true;
    };
    bound_ms = TimeMedian(
        stream, flags.warmup, flags.runs, [&]() { return bound_step(kChunk); }, energy_ptr,
        &bound_joules);
    if (bound_ms < 0) {
      std::fprintf(stderr, "bound GEMMs failed\n");
      return 1;
    }
    PlanRequest pr;
    pr.strategy = Strategy::kChunked;
    pr.num_tokens = sh.bt;
    pr.hidden_dtype = DType::kBF16;
    pr.streaming = true;
    const absl::StatusOr<Plan> plan = engine->PlanFor(*head, pr);
    if (plan.ok() && plan->chunk_tokens > 0 && plan->chunk_tokens < kChunk) {
      plan_chunk = plan->chunk_tokens;
      bound_at_plan_chunk_ms =
          TimeMedian(stream, flags.warmup, flags.runs, [&]() { return bound_step(plan_chunk); });
    }
    const double flops = 6.0 * sh.bt * sh.v * sh.h;
    std::printf("  3-GEMM bound: %.2f ms (%.0f TFLOP/s)%s\n", bound_ms, flops / bound_ms / 1e9,
                Joules(bound_joules).c_str());
    if (bound_at_plan_chunk_ms > 0) {
      std::printf("  the same GEMMs in the default plan's %lld-token chunks: %.2f ms\n",
                  static_cast<long long>(plan_chunk), bound_at_plan_chunk_ms);
    }
    // The fields every record of this shape carries.
    const auto shape_record = [&](const std::string& strategy) {
      return nlohmann::json{{"strategy", strategy},
                            {"BT", sh.bt},
                            {"H", sh.h},
                            {"V", sh.v},
                            {"dtype", "bf16"},
                            {"gemm_bound_ms", bound_ms},
                            {"gemm_bound_joules", bound_joules},
                            {"gemm_bound_at_plan_chunk_ms", bound_at_plan_chunk_ms},
                            {"plan_chunk_tokens", plan_chunk},
                            {"gpu", gpu},
                            {"date", date},
                            {"commit", flags.commit}};
    };
    if (flags.stages) {
      PlanRequest pr;
      pr.strategy = Strategy::kChunked;
      pr.num_tokens = sh.bt;
      pr.hidden_dtype = DType::kBF16;
      // One record per path's stage breakdown (the logits-stats path when this
      // GPU takes it, and the cuBLAS fp32-logits path).
      auto record_stages = [&](const char* strategy, const char* label, const Plan& plan,
                               const nlohmann::json& st) {
        const double chunks = std::ceil(double(sh.bt) / plan.chunk_tokens);
        std::printf("  %sone chunk of %lld tokens (x%.0f chunks): %s\n", label,
                    (long long)plan.chunk_tokens, chunks, st.dump().c_str());
        nlohmann::json rec = shape_record(strategy);
        rec["chunks"] = chunks;
        rec[std::string(strategy) == "chunked_pipeline_stages" ? "stages_total_ms"
                                                               : "stages_per_chunk_ms"] = st;
        records.push_back(rec);
      };
      auto tile_plan = engine->PlanFor(*head, pr);
      if (tile_plan.ok() && tile_plan->tile_stats) {
        record_stages("chunked_tile_stats_stage_breakdown", "logits-stats path, ", *tile_plan,
                      TileStageBreakdown(*engine, *head, *tile_plan, req, 5, energy_ptr));
        for (const char* backward : {"cublas", "own", static_cast<const char*>(nullptr)}) {
          record_stages("chunked_pipeline_stages", "whole runs, stages summed over chunks, ",
                        *tile_plan, PipelineStages(*engine, *head, *tile_plan, req, 3, backward));
        }
      }
      setenv("FLCE_CUDA_LOGITS", "cublas", 1);
      auto plan = engine->PlanFor(*head, pr);
      unsetenv("FLCE_CUDA_LOGITS");
      if (plan.ok()) {
        record_stages("chunked_stage_breakdown", "", *plan,
                      StageBreakdown(*engine, *head, *plan, req, 5));
      }
    }

    // Each strategy's plan and call, the engine switches it names set around
    // its planning and each of its runs.
    struct Entry {
      std::string spelled;
      nlohmann::json rec;
      std::vector<std::pair<std::string, std::string>> env;
      CudaEngine* runner = nullptr;
      Plan plan;
      DeviceRequest r;
      // Set for a pipeline that is not the engine's (cublas_quack_rebuild):
      // it runs instead of a plan; its scratch in direct_workspace_bytes.
      std::function<absl::Status()> direct;
      int64_t direct_workspace_bytes = 0;
      double scale = 1.0;
      int runs = 0, warmup = 0;
      absl::Status status;
    };
    const auto set_env = [](const Entry& e) {
      for (const auto& [name, value] : e.env) setenv(name.c_str(), value.c_str(), 1);
    };
    const auto clear_env = [](const Entry& e) {
      for (const auto& kv : e.env) unsetenv(kv.first.c_str());
    };
    std::vector<Entry> entries;
    entries.reserve(flags.strategies.size());
    std::vector<DeviceBuffer> direct_buffers;  // the direct entries' scratch
    for (const std::string& spelled : flags.strategies) {
      Entry e;
      e.spelled = spelled;
      // NAME@VAR=VALUE[@VAR=VALUE...]: the variables set around this strategy's runs.
      const size_t at_sign = spelled.find('@');
      const std::string name = spelled.substr(0, at_sign);
      const char* row_kernel = name == "chunked_two_pass"  ? "two_pass"
                               : name == "chunked_cluster" ? "cluster"
                                                           : nullptr;
      const bool cublas_logits =
          row_kernel != nullptr || name == "chunked_overlap" || name == "chunked_cublas";
      const char* backward = name == "chunked_cublas_backward" ? "cublas"
                             : name == "chunked_own_backward"  ? "own"
                                                               : nullptr;
      const bool entropy = name == "chunked_entropy" || name == "chunked_accuracy";
      const Strategy strategy = cublas_logits || backward != nullptr || entropy
                                    ? Strategy::kChunked
                                    : ParseStrategy(name);
      if (cublas_logits) e.env.emplace_back("FLCE_CUDA_LOGITS", "cublas");
      if (row_kernel != nullptr) e.env.emplace_back("FLCE_CUDA_ROW_KERNEL", row_kernel);
      if (name == "chunked_overlap") e.env.emplace_back("FLCE_CUDA_OVERLAP", "1");
      if (backward != nullptr) e.env.emplace_back("FLCE_CUDA_BACKWARD", backward);
      if (at_sign != std::string::npos) {
        for (const absl::string_view assignment :
             absl::StrSplit(absl::string_view(spelled).substr(at_sign + 1), '@')) {
          const size_t eq = assignment.find('=');
          e.env.emplace_back(
              std::string(assignment.substr(0, eq)),
              eq == absl::string_view::npos ? "" : std::string(assignment.substr(eq + 1)));
        }
      }
      e.rec = shape_record(spelled);
      e.rec["workspace_budget_mib"] = flags.workspace_mb;
      if (name == kQuackRebuild) {
        if (!quack_checked) {
          const nlohmann::json check = ValidateQuackRebuild(cublas, stream);
          std::printf("  %s against float64: %s\n", kQuackRebuild, check.dump().c_str());
          records.push_back(check);
          if (!check.value("ok", false)) return 1;
          quack_checked = true;
        }
        const int64_t chunk = QuackRebuildArgs{}.chunk;
        auto logits = DeviceBuffer::Allocate(chunk * vp * 2, engine->context()->health());
        auto loss = DeviceBuffer::Allocate(sh.bt * 4, engine->context()->health());
        if (!logits.ok() || !loss.ok()) {
          std::fprintf(stderr, "%s: scratch allocation failed\n", kQuackRebuild);
          return 1;
        }
        QuackRebuildArgs q;
        q.rows = sh.bt;
        q.hidden = sh.h;
        q.vocab = sh.v;
        q.padded_vocab = vp;
        q.x = xbuf->get();
        q.w = head->view().weight;
        q.target = target;
        q.grad_scale = 1.0f / static_cast<float>(n_valid);
        q.logits = logits->get();
        q.loss = static_cast<float*>(loss->get());
        q.grad_input = gibuf->get();
        q.grad_weight = grad->weight();
        e.direct_workspace_bytes = logits->bytes();
        e.rec["chunk_tokens"] = chunk;
        direct_buffers.push_back(std::move(*logits));
        direct_buffers.push_back(std::move(*loss));
        e.direct = [&cublas, &stream, q]() {
          std::string why;
          if (RunQuackRebuild(cublas, q, stream, &why)) return absl::OkStatus();
          return absl::InternalError(why);
        };
        e.runs = flags.runs;
        e.warmup = flags.warmup;
        entries.push_back(std::move(e));
        continue;
      }
      if (name == kBestAlgoBound) {
        BoundBuffers bb;
        bb.rows = sh.bt;
        bb.hidden = sh.h;
        bb.padded_vocab = vp;
        bb.x = xbuf->get();
        bb.w = head->view().weight;
        bb.logits = lbuf->get();
        bb.grad_input = gibuf->get();
        bb.grad_weight = grad->weight();
        nlohmann::json search;
        std::string why;
        std::shared_ptr<BestAlgoBound> best = BestAlgoBound::Search(lt, stream, bb, kChunk,
                                                                    &search, &why);
        if (best == nullptr) {
          std::fprintf(stderr, "%s: %s\n", kBestAlgoBound, why.c_str());
          return 1;
        }
        search["strategy"] = kBestAlgoBound;
        search["record"] = "algorithm search";
        std::printf("  %s: chosen ranks", kBestAlgoBound);
        for (const auto& product : search["products"]) {
          std::printf(" %s #%d (%.3f ms, heuristic's first %s)",
                      product["product"].get<std::string>().c_str(),
                      product["chosen_rank"].get<int>(), product["chosen_ms"].get<double>(),
                      product["heuristic_first_ms"].dump().c_str());
        }
        std::printf("\n");
        records.push_back(search);
        e.rec["chunk_tokens"] = kChunk;
        e.direct = [best]() {
          std::string why;
          if (best->Run(&why)) return absl::OkStatus();
          return absl::InternalError(why);
        };
        e.runs = flags.runs;
        e.warmup = flags.warmup;
        entries.push_back(std::move(e));
        continue;
      }
      PlanRequest pr;
      pr.strategy = strategy;
      pr.num_tokens = sh.bt;
      pr.hidden_dtype = DType::kBF16;
      pr.streaming = true;  // the served plan: room for two upload/download slots
      e.runner = engine.get();
      set_env(e);
      absl::StatusOr<Plan> plan = e.runner->PlanFor(*head, pr);
      if (!plan.ok() && wall != nullptr &&
          (strategy == Strategy::kNaive || strategy == Strategy::kSeparate)) {
        e.rec["refused_at_budget"] = std::string(plan.status().message());
        e.runner = wall.get();
        plan = e.runner->PlanFor(*head, pr);
        e.rec["workspace_budget_mib"] = flags.wall_mb;
      }
      clear_env(e);
      if (!plan.ok()) {
        e.rec["refused"] = std::string(plan.status().message());
        e.rec["ms"] = nullptr;
        e.rec["ratio"] = nullptr;
        e.rec["workspace_peak_mib"] = nullptr;
        std::printf("  %-12s refused: %s\n", spelled.c_str(),
                    std::string(plan.status().message()).c_str());
        records.push_back(e.rec);
        continue;
      }
      e.plan = *plan;
      e.r = req;
      if (entropy) e.r.out.entropy = entropy_out;
      if (name == "chunked_accuracy") e.r.out.argmax = argmax;
      e.runs = flags.runs;
      e.warmup = flags.warmup;
      if (e.plan.strategy == Strategy::kFuseMN && sh.bt > flags.fuse_mn_tokens) {
        // Seconds per run at these shapes: time a token slice, scale by BT.
        e.r.rows = flags.fuse_mn_tokens;
        e.scale = double(sh.bt) / e.r.rows;
        e.runs = 3;
        e.warmup = 1;
        e.rec["extrapolated_from_tokens"] = e.r.rows;
      }
      cuda::KernelReport kernels;
      kernels.AddRequest(e.runner->exec(), head->view(), e.plan, e.r);
      e.rec["kernels"] = kernels.Text();
      entries.push_back(std::move(e));
    }
    const auto call = [&](Entry& e) {
      return [&]() {
        if (e.direct) {
          e.status = e.direct();
          return e.status.ok();
        }
        set_env(e);
        e.status = e.runner->RunOnDevice(*head, e.plan, e.r);
        clear_env(e);
        return e.status.ok();
      };
    };
    // Interleaved: the bound first in the list, each strategy's times and
    // per-round ratios against the bound of its round.
    std::vector<std::vector<double>> rounds;
    bool rounds_ok = true;
    if (flags.interleave && !entries.empty()) {
      std::vector<std::function<bool()>> fns = {[&]() { return bound_step(kChunk); }};
      for (Entry& e : entries) fns.push_back(call(e));
      rounds_ok = TimeRounds(stream, flags.warmup, flags.runs, fns, &rounds);
      if (rounds_ok) {
        std::printf("  interleaved, %d rounds: 3-GEMM bound %.2f ms (median)\n", flags.runs,
                    Median(rounds[0]));
      }
    }
    for (size_t i = 0; i < entries.size(); ++i) {
      Entry& e = entries[i];
      nlohmann::json& rec = e.rec;
      double joules = -1.0;
      double ms = -1.0;
      double ratio = -1.0;
      if (flags.interleave) {
        if (rounds_ok) {
          const std::vector<double>& t = rounds[i + 1];
          std::vector<double> ratios, diffs;
          for (size_t k = 0; k < t.size(); ++k) {
            ratios.push_back(t[k] * e.scale / rounds[0][k]);
            diffs.push_back(t[k] * e.scale - rounds[1][k] * entries[0].scale);
          }
          ms = Median(t);
          ratio = Median(ratios);
          rec["interleaved"] = true;
          rec["round_ms"] = t;
          rec["round_bound_ms"] = rounds[0];
          rec["round_ratios"] = ratios;
          rec["bound_ms_interleaved"] = Median(rounds[0]);
          if (i > 0) {
            rec["paired_difference_ms_vs"] = entries[0].spelled;
            rec["paired_difference_ms"] = Median(diffs);
          }
        }
      } else {
        ms = TimeMedian(stream, e.warmup, e.runs, call(e), energy_ptr, &joules);
        if (ms >= 0) ratio = ms * e.scale / bound_ms;
      }
      if (ms < 0) {
        const std::string why =
            e.status.ok() ? "another call of the interleaved rounds failed" : e.status.ToString();
        rec["error"] = why;
        std::printf("  %-12s failed: %s\n", e.spelled.c_str(), why.c_str());
        records.push_back(rec);
        if (!engine->healthy()) break;
        continue;
      }
      ms *= e.scale;
      if (joules >= 0) joules *= e.scale;
      const Plan& plan = e.plan;
      const int64_t ws =
          e.direct ? e.direct_workspace_bytes
                   : plan.scratch_bytes +
                         (plan.strategy == Strategy::kChunked ? 2 * plan.stream_slot_bytes : 0);
      if (e.direct) {
        rec["strategy_used"] = e.spelled;
      } else {
        rec["strategy_used"] = StrategyName(plan.strategy);
        if (plan.strategy == Strategy::kChunked) {
          rec["logits_path"] = plan.tile_stats ? "logits_stats_gemm" : "cublas_fp32";
        }
        rec["chunk_tokens"] = plan.chunk_tokens;
        rec["split_cols"] = plan.split_cols;
      }
      rec["ms"] = ms;
      rec["ratio"] = ratio;
      rec["tflops"] = flops / ms / 1e9;
      rec["joules"] = joules;
      rec["workspace_peak_mib"] = ws / 1048576.0;
      rec["runs"] = flags.interleave ? flags.runs : e.runs;
      std::printf(
          "  %-12s %9.2f ms  %6.0f TFLOP/s  %5.3fx bound  workspace %7.1f MiB  (chunk %lld, split "
          "%lld)%s%s",
          e.spelled.c_str(), ms, flops / ms / 1e9, ratio, ws / 1048576.0,
          static_cast<long long>(rec.value("chunk_tokens", int64_t{0})),
          static_cast<long long>(rec.value("split_cols", int64_t{0})), Joules(joules).c_str(),
          e.scale != 1.0 ? "  [extrapolated]" : "");
      if (rec.contains("paired_difference_ms")) {
        std::printf("  %+.2f ms against %s (median of the rounds' differences)",
                    rec["paired_difference_ms"].get<double>(), entries[0].spelled.c_str());
      }
      std::printf("\n");
      std::fflush(stdout);
      records.push_back(rec);
    }
  }
  cublasLtDestroy(lt);
  cublasDestroy(cublas);
  if (!flags.out.empty()) {
    std::ofstream out(flags.out);
    out << records.dump(2) << "\n";
    std::printf("wrote %s\n", flags.out.c_str());
  }
  return 0;
}

}  // namespace
}  // namespace flce::bench

int main(int argc, char** argv) { return flce::bench::Main(argc, argv); }
