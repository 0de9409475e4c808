// flce_cpu_bench: the CPU engine's GFLOP/s over 6 BT V H (forward + backward,
// grad_input and grad_W) next to OpenBLAS's own sgemm rate on the same three
// GEMM shapes, chunk by chunk, on the same threads, and the row pass alone.
//
//   flce_cpu_bench [--bt 4096 --h 512 --v 32000 --runs 5 --threads 0
//                   --chunk_tokens 0 --dtypes fp32,bf16 --json out.json]
#include <cblas.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_split.h"
#include "bench/cpu/bench_env.h"
#include "bench/cpu/engine_timing.h"
#include "bench/cpu/gemm_bound.h"
#include "bench/cpu/row_pass_timing.h"
#include "kernels/cpu/cpu_context.h"
#include "kernels/cpu/cpu_engine.h"
#include "kernels/engine_factory.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(int64_t, bt, 4096, "tokens per request");
ABSL_FLAG(int64_t, h, 512, "hidden size");
ABSL_FLAG(int64_t, v, 32000, "vocabulary size");
ABSL_FLAG(int, runs, 5, "timed runs per measurement (median reported)");
ABSL_FLAG(int, warmup, 1, "untimed runs first");
ABSL_FLAG(int, threads, 0, "engine and OpenBLAS threads; 0 = all cores");
ABSL_FLAG(int64_t, chunk_tokens, 0, "engine token chunk; 0 = engine's choice");
ABSL_FLAG(int64_t, workspace_mb, 2048, "engine workspace budget");
ABSL_FLAG(std::string, dtypes, "fp32,bf16", "head (and hidden) dtypes to run");
ABSL_FLAG(std::string, json, "", "write results here as JSON");
ABSL_FLAG(float, softcap, 0.0f, "logit softcap c for the engine and the row pass; 0 = none");

namespace flce::bench {
namespace {

int Main() {
  const int64_t BT = absl::GetFlag(FLAGS_bt);
  const int64_t H = absl::GetFlag(FLAGS_h);
  const int64_t V = absl::GetFlag(FLAGS_v);
  const int runs = absl::GetFlag(FLAGS_runs);
  const int warmup = absl::GetFlag(FLAGS_warmup);
  EngineConfig config;
  config.threads = absl::GetFlag(FLAGS_threads);
  config.workspace_bytes = absl::GetFlag(FLAGS_workspace_mb) << 20;
  const int threads = cpu::ResolveThreads(config);
  absl::StatusOr<std::unique_ptr<Engine>> engine = CreateCpuEngine(config);
  if (!engine.ok()) {
    std::fprintf(stderr, "engine: %s\n", engine.status().ToString().c_str());
    return 1;
  }
  const int64_t requested_chunk = absl::GetFlag(FLAGS_chunk_tokens);
  const int64_t chunk = requested_chunk > 0 ? requested_chunk : cpu::kDefaultChunkTokens;
  const double flops = 6.0 * BT * V * H;
  std::fprintf(stderr, "flce_cpu_bench: BT=%ld H=%ld V=%ld threads=%d chunk=%ld cpu=%s\n", BT, H,
               V, threads, chunk, CpuModel().c_str());

  // Engines, the bound and the row pass alone are measured in turn within
  // each iteration, so that a busy shared machine slows them alike; the
  // ratio is taken per iteration, then the median.
  std::vector<DType> dtypes;
  const std::vector<std::string> dtype_names = absl::StrSplit(absl::GetFlag(FLAGS_dtypes), ',');
  std::vector<std::unique_ptr<EngineBench>> benches;
  for (const std::string& name : dtype_names) {
    BenchProblem problem;
    problem.num_tokens = BT;
    problem.vocab_size = V;
    problem.hidden_size = H;
    problem.chunk_tokens = requested_chunk;
    problem.options.softcap = absl::GetFlag(FLAGS_softcap);
    if (name == "fp32") {
      problem.dtype = DType::kF32;
    } else if (name == "bf16") {
      problem.dtype = DType::kBF16;
    } else if (name == "fp16") {
      problem.dtype = DType::kF16;
    } else {
      std::fprintf(stderr, "unknown dtype %s\n", name.c_str());
      return 1;
    }
    absl::StatusOr<std::unique_ptr<EngineBench>> bench = EngineBench::Create(**engine, problem);
    if (!bench.ok()) {
      std::fprintf(stderr, "setup: %s\n", bench.status().ToString().c_str());
      return 1;
    }
    benches.push_back(std::move(*bench));
  }
  std::vector<double> total, logits, grad_input, grad_weight, row_pass;
  std::vector<std::vector<double>> engine_ms(benches.size()), ratios(benches.size());
  // Per dtype and phase (logits GEMM, row pass, grad_input GEMM, grad_W GEMM):
  // the engine's own clock, one entry per timed run.
  const auto* cpu_engine = dynamic_cast<const cpu::CpuEngine*>(engine->get());
  std::vector<std::array<std::vector<double>, 4>> phases(benches.size());
  for (int i = 0; i < warmup + runs; ++i) {
    const GemmTimes t = TimeThreeGemms(BT, V, H, chunk);
    const double rows_ms = TimeRowPass(BT, V, chunk, threads, absl::GetFlag(FLAGS_softcap));
    for (size_t d = 0; d < benches.size(); ++d) {
      const cpu::PhaseTimes before = cpu_engine->phase_times();
      absl::StatusOr<double> ms = benches[d]->RunOnce(/*backward=*/true);
      const cpu::PhaseTimes after = cpu_engine->phase_times();
      if (!ms.ok()) {
        std::fprintf(stderr, "run: %s\n", ms.status().ToString().c_str());
        return 1;
      }
      std::fprintf(stderr, "  %s run %d: engine %.1f ms, sgemm %.1f ms, row pass %.1f ms\n",
                   dtype_names[d].c_str(), i, *ms, t.total_ms(), rows_ms);
      if (i < warmup) continue;
      phases[d][0].push_back(after.logits_gemm - before.logits_gemm);
      phases[d][1].push_back(after.row_pass - before.row_pass);
      phases[d][2].push_back(after.grad_input_gemm - before.grad_input_gemm);
      phases[d][3].push_back(after.grad_weight_gemm - before.grad_weight_gemm);
      engine_ms[d].push_back(*ms);
      ratios[d].push_back(t.total_ms() / *ms);
    }
    if (i < warmup) continue;
    total.push_back(t.total_ms());
    logits.push_back(t.logits_ms);
    grad_input.push_back(t.grad_input_ms);
    grad_weight.push_back(t.grad_weight_ms);
    row_pass.push_back(rows_ms);
  }
  const double bound_ms = Median(total);
  const double bound_gflops = flops / bound_ms * 1e-6;
  const double row_pass_ms = Median(row_pass);

  std::printf("%-6s %12s %10s %14s\n", "dtype", "engine ms", "GFLOP/s", "of sgemm rate");
  for (size_t d = 0; d < benches.size(); ++d) {
    const double ms = Median(engine_ms[d]);
    std::printf("%-6s %12.1f %10.1f %13.1f%%\n", dtype_names[d].c_str(), ms, flops / ms * 1e-6,
                100.0 * Median(ratios[d]));
  }
  for (size_t d = 0; d < benches.size(); ++d) {
    std::printf("  %s inside the engine: X W^T %.1f ms, row pass %.1f ms, dR W %.1f ms, "
                "dR^T X %.1f ms\n",
                dtype_names[d].c_str(), Median(phases[d][0]), Median(phases[d][1]),
                Median(phases[d][2]), Median(phases[d][3]));
  }
  std::printf("sgemm  %12.1f %10.1f   (X W^T %.1f ms, dR W %.1f ms, dR^T X %.1f ms)\n", bound_ms,
              bound_gflops, Median(logits), Median(grad_input), Median(grad_weight));
  std::printf("row pass alone: %.1f ms (%.2f ns per logit)\n", row_pass_ms,
              row_pass_ms * 1e6 / (static_cast<double>(BT) * V));

  if (const std::string path = absl::GetFlag(FLAGS_json); !path.empty()) {
    nlohmann::json out;
    out["benchmark"] = "flce_cpu_bench";
    out["date"] = UtcNow();
    out["git_commit"] = GitCommit();
    out["cpu_model"] = CpuModel();
    out["threads"] = threads;
    out["softcap"] = absl::GetFlag(FLAGS_softcap);
    out["shape"] = {{"bt", BT}, {"h", H}, {"v", V}};
    out["chunk_tokens"] = chunk;
    out["runs"] = runs;
    out["warmup"] = warmup;
    out["flops_per_call"] = flops;
    out["openblas_config"] = openblas_get_config();
    // Both change OpenBLAS's speed and how it shares cores with the row pass
    // (docs/perf/cpu.md); they are read when the library loads.
    for (const char* name : {"OPENBLAS_CORETYPE", "OPENBLAS_THREAD_TIMEOUT"}) {
      const char* value = std::getenv(name);
      out["env"][name] = value != nullptr ? value : "";
    }
    out["row_pass_ms"] = row_pass_ms;
    out["sgemm_bound"] = {{"ms", bound_ms},
                          {"gflops", bound_gflops},
                          {"logits_ms", Median(logits)},
                          {"grad_input_ms", Median(grad_input)},
                          {"grad_weight_ms", Median(grad_weight)}};
    for (size_t d = 0; d < benches.size(); ++d) {
      const double ms = Median(engine_ms[d]);
      out["engine"][dtype_names[d]] = {{"ms", ms},
                                       {"gflops", flops / ms * 1e-6},
                                       {"ratio_to_sgemm", Median(ratios[d])},
                                       {"runs_ms", engine_ms[d]},
                                       {"phases_ms",
                                        {{"logits_gemm", Median(phases[d][0])},
                                         {"row_pass", Median(phases[d][1])},
                                         {"grad_input_gemm", Median(phases[d][2])},
                                         {"grad_weight_gemm", Median(phases[d][3])}}}};
    }
    out["sgemm_bound"]["runs_ms"] = total;
    std::ofstream file(path);
    file << out.dump(2) << "\n";
    if (!file) {
      std::fprintf(stderr, "cannot write %s\n", path.c_str());
      return 1;
    }
  }
  return 0;
}

}  // namespace
}  // namespace flce::bench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return flce::bench::Main();
}
