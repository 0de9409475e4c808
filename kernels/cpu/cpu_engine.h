// The CPU engine: heads in host memory as fp32, token-chunked fused linear +
// cross-entropy with OpenBLAS sgemm for the three GEMMs and a thread pool for
// the row pass. Every strategy name runs the same plan ("cpu_chunked").
//
// Deterministic by construction: each logit row is reduced by one thread in a
// fixed order, per-token results are summed in token order, OpenBLAS splits
// GEMM outputs (never the K sum) across its threads. The same request with the
// same chunk size and the same hidden arrival order gives bitwise the same
// result; grad_W may differ in the last bits when chunking differs, because
// the sum over tokens is then grouped differently.
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
  bool healthy() const override { return true; }

 private:
  std::shared_ptr<CpuContext> ctx_;
};

// Threads the engine uses for a config (0 = hardware concurrency).
int ResolveThreads(const EngineConfig& config);

}  // namespace flce::cpu

#endif  // FLCE_KERNELS_CPU_CPU_ENGINE_H_
