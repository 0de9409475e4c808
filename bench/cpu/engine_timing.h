// Times the CPU engine on one problem the way the server drives it: hidden in
// row blocks, grad_input out through the sink, grad_W into a GradBuffer.
#ifndef FLCE_BENCH_CPU_ENGINE_TIMING_H_
#define FLCE_BENCH_CPU_ENGINE_TIMING_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/engine.h"

namespace flce::bench {

struct BenchProblem {
  int64_t num_tokens = 4096;
  int64_t vocab_size = 32000;
  int64_t hidden_size = 512;
  DType dtype = DType::kF32;  // head and hidden
  int64_t chunk_tokens = 0;   // 0 = engine's choice
  int64_t rows_per_block = 1024;
  LossOptions options;  // e.g. a softcap, which adds a tanh per logit
};

class EngineBench {
 public:
  // Builds the head and the inputs (random, MATH.md's distributions).
  static absl::StatusOr<std::unique_ptr<EngineBench>> Create(Engine& engine,
                                                             const BenchProblem& problem);
  // Milliseconds for one call, StartCompute to Finish. backward = false runs
  // forward only (loss, no grad_input, no grad_W).
  absl::StatusOr<double> RunOnce(bool backward);

 private:
  EngineBench(Engine& engine, const BenchProblem& problem) : engine_(engine), problem_(problem) {}

  Engine& engine_;
  BenchProblem problem_;
  std::shared_ptr<const Head> head_;
  std::unique_ptr<GradBuffer> grad_;
  std::string hidden_;
  std::vector<int32_t> targets_;
};

}  // namespace flce::bench

#endif  // FLCE_BENCH_CPU_ENGINE_TIMING_H_
