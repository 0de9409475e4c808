// The CUDA engine's HeadOptimizer: master and moments in device memory, a
// read-only check pass then one fused update pass per parameter group
// (optimizer_kernels.cuh), on the context's auxiliary stream.
#ifndef FLCE_KERNELS_CUDA_ENGINE_CUDA_OPTIMIZER_H_
#define FLCE_KERNELS_CUDA_ENGINE_CUDA_OPTIMIZER_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "kernels/cuda/engine/cuda_grad_buffer.h"
#include "kernels/cuda/engine/cuda_head.h"
#include "kernels/cuda/engine/device_context.h"
#include "kernels/cuda/ops/optimizer_kernels.cuh"
#include "kernels/engine.h"

namespace flce::cuda {

class CudaHeadOptimizer : public HeadOptimizer {
 public:
  static absl::StatusOr<std::unique_ptr<CudaHeadOptimizer>> Create(
      std::shared_ptr<const CudaHead> head, const OptimizerConfig& config);

  const OptimizerConfig& config() const override { return config_; }
  int64_t state_bytes() const override;
  int64_t steps() const override { return steps_; }
  absl::StatusOr<StepResult> Step(const GradBuffer& grad, const StepParams& params) override;
  absl::Status ReadState(HeadTensor group, OptimizerTensor tensor, int64_t begin, int64_t count,
                         float* host_out) const override;
  absl::Status WriteState(HeadTensor group, OptimizerTensor tensor, int64_t begin, int64_t count,
                          const float* host) override;
  void set_steps(int64_t steps) override { steps_ = steps; }

  // Step's two halves, for a head split across GPUs that must check every
  // shard before it changes any: what Step would return (nothing changes),
  // then the update itself.
  absl::StatusOr<StepResult> CheckStep(const GradBuffer& grad, const StepParams& params) const;
  absl::Status ApplyStep(const GradBuffer& grad, const StepParams& params);

 private:
  struct StepArrays {
    ElementStep w, b;
    OptimizerArrays wa, ba;
  };
  absl::StatusOr<StepArrays> Prepare(const GradBuffer& grad, const StepParams& params) const;
  // One parameter group: its real elements only (V x H, or V), which are a
  // prefix of the head's and the gradient's padded buffers.
  struct Group {
    const OptimizerGroup* hyper = nullptr;
    void* served = nullptr;  // the head's weight or bias, in the head's dtype
    int64_t count = 0;
    DeviceBuffer master;  // fp32; empty for fp32 heads, whose weight is the master
    DeviceBuffer m, v, vmax;
  };

  CudaHeadOptimizer(std::shared_ptr<const CudaHead> head, const OptimizerConfig& config);
  absl::Status InitGroup(Group& group, const OptimizerGroup& hyper, void* served, int64_t count);
  OptimizerArrays Arrays(const Group& group, const float* grad) const;
  // The device array holding `tensor` of `group` and the group's size, or NOT_FOUND.
  absl::StatusOr<float*> StateArray(HeadTensor group, OptimizerTensor tensor) const;

  std::shared_ptr<const CudaHead> head_;
  std::shared_ptr<DeviceContext> ctx_;
  OptimizerConfig config_;
  DType dtype_;
  Group weight_;
  Group bias_;
  int64_t steps_ = 0;
};

}  // namespace flce::cuda

#endif  // FLCE_KERNELS_CUDA_ENGINE_CUDA_OPTIMIZER_H_
