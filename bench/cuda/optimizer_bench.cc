// flce_optimizer_bench: what training the head on the server costs on the GPU.
//
// For each shape and optimizer: the two passes of a step (the read-only check
// and the fused update) timed with CUDA events and expressed as effective
// bandwidth over the bytes each touches per parameter, next to a
// device-to-device copy measured in the same process; the whole
// HeadOptimizer::Step and GradBuffer::SquaredNorms as the server calls them
// (wall clock, they synchronise); and at the seed shape one Compute call
// through the engine API, so that compute + GradNorm + Step can be compared
// with compute alone.
//
//   flce_optimizer_bench --out=bench/results/optimizer-2026-12-01.json --commit=$(git rev-parse
//   HEAD)
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench/cuda/bench_check.h"
#include "bench/cuda/bench_data.cuh"
#include "core/dtype.h"
#include "kernels/cuda/base/policy.h"
#include "kernels/cuda/engine/cuda_engine.h"
#include "kernels/cuda/ops/optimizer_kernels.cuh"
#include "nlohmann/json.hpp"

namespace flce::bench {
namespace {

using cuda::CudaEngine;
using cuda::CudaGradBuffer;
using cuda::CudaHead;
using cuda::DeviceBuffer;
using cuda::DeviceHealth;

template <typename T>
T Must(absl::StatusOr<T> value, const char* what) {
  if (!value.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, value.status().ToString().c_str());
    std::exit(1);
  }
  return std::move(*value);
}

using flce::bench::Median;

// Median milliseconds of `runs` launches of fn on `stream`, after one warm-up.
double TimeEvents(cudaStream_t stream, int runs, const std::function<void()>& fn) {
  fn();
  cudaEvent_t a, b;
  CHECK_CUDA(cudaEventCreate(&a));
  CHECK_CUDA(cudaEventCreate(&b));
  std::vector<double> ms;
  for (int i = 0; i < runs; ++i) {
    CHECK_CUDA(cudaEventRecord(a, stream));
    fn();
    CHECK_CUDA(cudaEventRecord(b, stream));
    CHECK_CUDA(cudaEventSynchronize(b));
    float t = 0;
    CHECK_CUDA(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  CHECK_CUDA(cudaEventDestroy(a));
  CHECK_CUDA(cudaEventDestroy(b));
  return Median(ms);
}

// Median wall milliseconds of `runs` calls of fn (which synchronises), after one warm-up.
double TimeWall(int runs, const std::function<void()>& fn) {
  fn();
  std::vector<double> ms;
  for (int i = 0; i < runs; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    fn();
    ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  return Median(ms);
}

std::string Today() {
  std::time_t now = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d", std::gmtime(&now));
  return buf;
}

struct Shape {
  int64_t v, h;
  int64_t compute_tokens;  // > 0: also time a Compute call of this many tokens
};

struct Case {
  const char* name;
  OptimizerConfig config;
  // Bytes per parameter of each pass (bf16 head, fp32 master):
  int check_bytes;  // reads grad, master and the moments
  int apply_bytes;  // reads them, writes master and moments, writes the bf16 weight
};

std::vector<Case> Cases() {
  OptimizerConfig adamw;
  adamw.kind = OptimizerKind::kAdamW;
  adamw.weight = DefaultOptimizerGroup(OptimizerKind::kAdamW);
  adamw.bias = adamw.weight;
  OptimizerConfig sgd;
  sgd.kind = OptimizerKind::kSgd;
  sgd.weight.momentum = 0.9;
  sgd.bias = sgd.weight;
  // AdamW: grad 4 + master 4 + exp_avg 4 + exp_avg_sq 4 read; master, moments 12 + bf16 2 written.
  // SGD with momentum: grad 4 + master 4 + buffer 4 read; master, buffer 8 + bf16 2 written.
  return {{"adamw", adamw, 16, 30}, {"sgd_momentum", sgd, 12, 22}};
}

int Main(int argc, char** argv) {
  std::string out_path, commit = "unknown";
  int runs = 20;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--out=", 0) == 0)
      out_path = a.substr(6);
    else if (a.rfind("--commit=", 0) == 0)
      commit = a.substr(9);
    else if (a.rfind("--runs=", 0) == 0)
      runs = std::stoi(a.substr(7));
    else {
      std::fprintf(stderr, "unknown flag %s\n", a.c_str());
      return 2;
    }
  }
  EngineConfig config;
  auto engine = Must(CudaEngine::Create(config), "CUDA engine");
  cudaStream_t stream = engine->compute_stream();
  DeviceHealth* health = engine->context()->health();
  nlohmann::json records = nlohmann::json::array();

  // A device-to-device copy of 2 GiB: the bandwidth an elementwise pass can hope for.
  double copy_gbps;
  {
    const int64_t bytes = int64_t{2} << 30;
    DeviceBuffer src = Must(DeviceBuffer::Allocate(bytes, health), "copy source");
    DeviceBuffer dst = Must(DeviceBuffer::Allocate(bytes, health), "copy destination");
    CHECK_CUDA(cudaMemsetAsync(src.get(), 1, bytes, stream));
    const double ms = TimeEvents(stream, runs, [&] {
      CHECK_CUDA(cudaMemcpyAsync(dst.get(), src.get(), bytes, cudaMemcpyDeviceToDevice, stream));
    });
    copy_gbps = 2.0 * bytes / (ms * 1e6);  // read + write
    std::printf("device-to-device copy: %.1f GB/s (read + write)\n", copy_gbps);
  }

  const Shape shapes[] = {{176245, 1024, 65535}, {262144, 8192, 0}};
  for (const Shape& sh : shapes) {
    const int64_t params = sh.v * sh.h;
    std::printf("== V=%lld H=%lld bf16 (%.2f G parameters)\n", (long long)sh.v, (long long)sh.h,
                params / 1e9);
    HeadSpec spec{sh.v, sh.h, DType::kBF16, false};
    const int64_t vp = cuda::PadVocab(sh.v);
    DeviceBuffer w = Must(DeviceBuffer::Allocate(vp * sh.h * 2, health), "weight");
    CHECK_CUDA(cudaMemsetAsync(w.get(), 0, w.bytes(), stream));
    CHECK_CUDA(FillNormalBf16(w.get(), params, 1.0f / std::sqrt(float(sh.h)), 11, stream));
    auto head =
        std::make_shared<CudaHead>(engine->shared_context(), spec, std::move(w), DeviceBuffer());
    auto grad_owner = Must(engine->NewGradBuffer(spec), "gradient");
    auto* grad = static_cast<CudaGradBuffer*>(grad_owner.get());
    CHECK_CUDA(FillNormalF32(grad->weight(), params, 1e-3f, 12, stream));
    CHECK_CUDA(cudaStreamSynchronize(stream));

    double compute_ms = 0.0;
    if (sh.compute_tokens > 0) {
      // One Compute call as the server makes it: hidden from host memory.
      std::mt19937 rng(5);
      std::normal_distribution<float> normal(0.0f, 1.0f);
      std::vector<float> hidden_f(sh.compute_tokens * sh.h);
      for (float& x : hidden_f) x = normal(rng);
      std::string hidden(hidden_f.size() * 2, '\0');
      FromFloat(DType::kBF16, hidden_f.data(), hidden.data(), hidden_f.size());
      std::vector<int32_t> targets(sh.compute_tokens);
      for (int32_t& t : targets) t = static_cast<int32_t>(rng() % sh.v);
      auto staging = Must(engine->NewGradBuffer(spec), "staging gradient");
      compute_ms = TimeWall(5, [&] {
        ComputeSpec cs;
        cs.num_tokens = sh.compute_tokens;
        cs.hidden_dtype = DType::kBF16;
        cs.targets = targets;
        cs.grad_out = staging.get();
        auto call =
            Must(engine->StartCompute(head, cs, [](int64_t, int64_t, std::string) {}), "compute");
        if (!call->AddHidden(0, sh.compute_tokens, hidden.data()).ok()) std::exit(1);
        Must(call->Finish(), "compute finish");
      });
      std::printf("  compute (BT=%lld, through the engine API): %.2f ms\n",
                  (long long)sh.compute_tokens, compute_ms);
    }
    const double norm_ms = TimeWall(runs, [&] { Must(grad->SquaredNorms(), "norms"); });
    std::printf("  GradNorm (fp64 sum of squares): %.3f ms, %.1f GB/s\n", norm_ms,
                params * 4.0 / (norm_ms * 1e6));

    for (const Case& c : Cases()) {
      auto optimizer = Must(engine->CreateOptimizer(head, c.config), "optimizer");
      StepParams step;
      step.lr_weight = 1e-4;
      step.lr_bias = 1e-4;
      // The passes alone, on arrays shaped like the optimizer's own.
      DeviceBuffer master = Must(DeviceBuffer::Allocate(params * 4, health), "master");
      DeviceBuffer m = Must(DeviceBuffer::Allocate(params * 4, health), "m");
      DeviceBuffer v = Must(DeviceBuffer::Allocate(params * 4, health), "v");
      DeviceBuffer flags = Must(DeviceBuffer::Allocate(4, health), "flags");
      CHECK_CUDA(cudaMemsetAsync(m.get(), 0, params * 4, stream));
      CHECK_CUDA(cudaMemsetAsync(v.get(), 0, params * 4, stream));
      CHECK_CUDA(FillNormalF32(static_cast<float*>(master.get()), params, 0.03f, 13, stream));
      cuda::OptimizerArrays arrays;
      arrays.grad = grad->weight();
      arrays.params = static_cast<float*>(master.get());
      StateArrays kept = StateArraysFor(c.config.kind, c.config.weight);
      arrays.m = kept.m ? static_cast<float*>(m.get()) : nullptr;
      arrays.v = kept.v ? static_cast<float*>(v.get()) : nullptr;
      arrays.served = head->weight_for_update();
      arrays.served_dtype = DType::kBF16;
      arrays.count = params;
      const ElementStep es =
          MakeElementStep(c.config.kind, c.config.weight, 1e-4, 1.0f, 1, DType::kBF16);
      auto* flag_word = static_cast<unsigned*>(flags.get());
      const double check_ms = TimeEvents(stream, runs, [&] {
        if (!cuda::LaunchOptimizerCheck(c.config.kind, es, arrays, flag_word, stream, health).ok())
          std::exit(1);
      });
      const double apply_ms = TimeEvents(stream, runs, [&] {
        if (!cuda::LaunchOptimizerApply(c.config.kind, es, arrays, stream, health).ok())
          std::exit(1);
      });
      const double step_ms = TimeWall(runs, [&] {
        StepResult r = Must(optimizer->Step(*grad, step), "step");
        if (r != StepResult::kApplied) {
          std::fprintf(stderr, "step skipped: %s\n", StepResultName(r));
          std::exit(1);
        }
      });
      const double check_gbps = params * double(c.check_bytes) / (check_ms * 1e6);
      const double apply_gbps = params * double(c.apply_bytes) / (apply_ms * 1e6);
      std::printf(
          "  %-13s check %.3f ms (%.0f GB/s, %d B/param)  update %.3f ms (%.0f GB/s = %.0f%% of "
          "the copy, %d B/param)  Step %.3f ms  state %.2f GB\n",
          c.name, check_ms, check_gbps, c.check_bytes, apply_ms, apply_gbps,
          100.0 * apply_gbps / copy_gbps, c.apply_bytes, step_ms, optimizer->state_bytes() / 1e9);
      nlohmann::json r = {{"v", sh.v},
                          {"h", sh.h},
                          {"dtype", "bf16"},
                          {"optimizer", c.name},
                          {"params", params},
                          {"copy_gbps", copy_gbps},
                          {"check_ms", check_ms},
                          {"check_bytes_per_param", c.check_bytes},
                          {"check_gbps", check_gbps},
                          {"update_ms", apply_ms},
                          {"update_bytes_per_param", c.apply_bytes},
                          {"update_gbps", apply_gbps},
                          {"update_fraction_of_copy", apply_gbps / copy_gbps},
                          {"step_ms", step_ms},
                          {"grad_norm_ms", norm_ms},
                          {"state_bytes", optimizer->state_bytes()}};
      if (compute_ms > 0) {
        r["compute_tokens"] = sh.compute_tokens;
        r["compute_ms"] = compute_ms;
        r["train_step_ratio"] = (compute_ms + norm_ms + step_ms) / compute_ms;
        std::printf("  %-13s compute + GradNorm + Step = %.3fx compute alone\n", c.name,
                    (compute_ms + norm_ms + step_ms) / compute_ms);
      }
      records.push_back(r);
    }
  }
  nlohmann::json doc = {{"gpu", engine->info().name},
                        {"date", Today()},
                        {"commit", commit},
                        {"runs", runs},
                        {"records", records}};
  if (!out_path.empty()) std::ofstream(out_path) << doc.dump(2) << "\n";
  std::printf("%s\n", doc.dump().substr(0, 200).c_str());
  return 0;
}

}  // namespace
}  // namespace flce::bench

int main(int argc, char** argv) { return flce::bench::Main(argc, argv); }
