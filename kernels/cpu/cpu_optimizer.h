// The CPU engine's HeadOptimizer: state in host memory, one checking pass
// and one updating pass over each parameter group (optimizer_math.h).
#ifndef FLCE_KERNELS_CPU_CPU_OPTIMIZER_H_
#define FLCE_KERNELS_CPU_CPU_OPTIMIZER_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/cpu/cpu_head.h"
#include "kernels/engine.h"

namespace flce::cpu {

class CpuHeadOptimizer : public HeadOptimizer {
 public:
  static absl::StatusOr<std::unique_ptr<CpuHeadOptimizer>> Create(
      std::shared_ptr<const CpuHead> head, const OptimizerConfig& config);

  const OptimizerConfig& config() const override { return config_; }
  int64_t state_bytes() const override;
  int64_t steps() const override { return steps_; }
  absl::StatusOr<StepResult> Step(const GradBuffer& grad, const StepParams& params) override;
  absl::Status ReadState(HeadTensor group, OptimizerTensor tensor, int64_t begin, int64_t count,
                         float* host_out) const override;
  absl::Status WriteState(HeadTensor group, OptimizerTensor tensor, int64_t begin, int64_t count,
                          const float* host) override;
  void set_steps(int64_t steps) override { steps_ = steps; }

 private:
  // One parameter group's arrays. `served` is what compute calls read (the
  // head's fp32 values); a 16-bit head keeps its fp32 master apart, rounded
  // into `served` after each step.
  struct Group {
    const OptimizerGroup* hyper = nullptr;
    float* served = nullptr;
    int64_t size = 0;
    std::vector<float> master;  // empty: `served` is the master (fp32 heads)
    std::vector<float> m, v, vmax;
    float* params() { return master.empty() ? served : master.data(); }
    const float* params() const { return master.empty() ? served : master.data(); }
  };

  CpuHeadOptimizer(std::shared_ptr<const CpuHead> head, const OptimizerConfig& config);
  void InitGroup(Group& group, const OptimizerGroup& hyper, float* served, int64_t size);
  unsigned CheckGroup(Group& group, const float* grad, double lr, float multiplier) const;
  void ApplyGroup(Group& group, const float* grad, double lr, float multiplier);
  // The array holding `tensor` of `group`, or NOT_FOUND.
  absl::StatusOr<float*> StateArray(HeadTensor group, OptimizerTensor tensor) const;

  std::shared_ptr<const CpuHead> head_;
  OptimizerConfig config_;
  DType dtype_;
  Group weight_;
  Group bias_;
  int64_t steps_ = 0;
};

}  // namespace flce::cpu

#endif  // FLCE_KERNELS_CPU_CPU_OPTIMIZER_H_
