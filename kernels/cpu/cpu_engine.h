// The CPU engine: heads in host memory as fp32, token-chunked fused linear +
// cross-entropy with OpenBLAS sgemm for the three GEMMs and a thread pool for
// the row pass. Every strategy name runs the same plan ("cpu_chunked").
//
// Deterministic by construction: each logit row is reduced by one thread in a
// fixed order (fixed-lane sums, no atomics), grad_b columns are owned by one
// thread each, per-token results are summed in token order at Finish, and
// OpenBLAS's sgemm is repeatable for a given thread count. The same request
// with the same chunk size, thread count and hidden arrival order gives
// bitwise the same loss, grad_input and grad_W. Across chunk sizes or thread
// counts results agree to fp32 rounding (OpenBLAS picks kernels by shape and
// thread count), not bitwise.
#ifndef FLCE_KERNELS_CPU_CPU_ENGINE_H_
#define FLCE_KERNELS_CPU_CPU_ENGINE_H_

#include <memory>

#include "absl/status/statusor.h"
#include "kernels/cpu/cpu_context.h"
#include "kernels/engine.h"

namespace flce::cpu {

class CpuEngine : public Engine {
 public:
  explicit CpuEngine(const EngineConfig& config);
  EngineInfo info() const override;
  absl::StatusOr<std::unique_ptr<HeadBuilder>> BeginHead(const HeadSpec& spec) override;
  absl::StatusOr<std::unique_ptr<GradBuffer>> NewGradBuffer(const HeadSpec& spec) override;
  absl::StatusOr<std::unique_ptr<ComputeCall>> StartCompute(std::shared_ptr<const Head> head,
                                                            ComputeSpec spec,
                                                            GradInputSink sink) override;
  absl::StatusOr<std::unique_ptr<HeadOptimizer>> CreateOptimizer(
      std::shared_ptr<const Head> head, const OptimizerConfig& config) override;
  bool healthy() const override { return true; }
  // Time per phase of every chunk so far (waits for a running chunk).
  PhaseTimes phase_times() const;

 private:
  std::shared_ptr<CpuContext> ctx_;
};

// Threads the engine uses for a config (0 = hardware concurrency).
int ResolveThreads(const EngineConfig& config);

}  // namespace flce::cpu

#endif  // FLCE_KERNELS_CPU_CPU_ENGINE_H_
