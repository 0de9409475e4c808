// The fuse_mn plan: vocab_split's forward, then one kernel that recomputes each logits tile and
// applies its gradient (fp32 atomics).
#include <algorithm>

#include "core/status_macros.h"
#include "kernels/cuda/base/device_memory.h"
#include "kernels/cuda/ops/elementwise_kernels.cuh"
#include "kernels/cuda/ops/fuse_mn_kernel.cuh"
#include "kernels/cuda/plans/plan_parts.h"

namespace flce::cuda::plan_parts {

absl::Status RunFuseMNBlock(const Exec& exec, const HeadView& head, const Plan& plan,
                            const DeviceRequest& r, char* scratch) {
  FLCE_ASSIGN_OR_RETURN(const SplitBlock block, ForwardSplitBlock(exec, head, plan, r, scratch));
  if (!WantsBackward(r)) return absl::OkStatus();
  const Scratch& s = block.s;
  const void* x = block.x;
  if (r.grad_input != nullptr) {
    FLCE_CUDA_RETURN_IF_ERROR(
        cudaMemsetAsync(s.gi32, 0, r.rows * head.hidden * sizeof(float), exec.stream), exec.health);
  }
  FuseMNArgs a;
  a.x = x;
  a.w = head.weight;
  a.bias = head.bias;
  a.rows = r.rows;
  a.hidden = head.hidden;
  a.padded_vocab = head.padded_vocab;
  a.grad = s.grad;
  a.grad_input = r.grad_input != nullptr ? s.gi32 : nullptr;
  a.grad_weight = r.grad_weight;
  a.grad_bias = r.grad_bias;
  a.params = r.params;
  FLCE_RETURN_IF_ERROR(LaunchFuseMN(head.dtype, a, exec.stream, exec.health));
  if (r.grad_input != nullptr) {
    FLCE_RETURN_IF_ERROR(LaunchConvert(DType::kF32, s.gi32, r.hidden_dtype, r.grad_input,
                                       r.rows * head.hidden, exec.stream, exec.health));
  }
  return absl::OkStatus();
}

}  // namespace flce::cuda::plan_parts
