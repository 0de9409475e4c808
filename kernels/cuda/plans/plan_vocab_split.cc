// The vocab_split plan: blocks of tokens, the vocabulary in splits; per-row statistics across
// splits, then the cuBLAS backward split by split.
#include <algorithm>

#include "core/status_macros.h"
#include "kernels/cuda/ops/elementwise_kernels.cuh"
#include "kernels/cuda/ops/split_row_kernels.cuh"
#include "kernels/cuda/plans/plan_parts.h"

namespace flce::cuda::plan_parts {

absl::Status RunVocabSplitBlock(const Exec& exec, const HeadView& head, const Plan& plan,
                                const DeviceRequest& r, char* scratch) {
  FLCE_ASSIGN_OR_RETURN(const SplitBlock block, ForwardSplitBlock(exec, head, plan, r, scratch));
  if (!WantsBackward(r)) return absl::OkStatus();
  const Scratch& s = block.s;
  const void* x = block.x;
  const Gemm gemm = MakeGemm(exec, head);
  const int64_t esize = DTypeSize(head.dtype);
  if (r.grad_bias != nullptr) {
    FLCE_RETURN_IF_ERROR(LaunchFillOnes(head.dtype, s.ones, r.rows, exec.stream, exec.health));
  }
  for (int64_t col0 = 0; col0 < head.padded_vocab; col0 += plan.split_cols) {
    const int64_t cols = std::min(plan.split_cols, head.padded_vocab - col0);
    const void* w = static_cast<const char*>(head.weight) + col0 * head.hidden * esize;
    FLCE_RETURN_IF_ERROR(gemm.Logits(x, w, r.rows, cols, head.hidden, s.logits, cols));
    const SplitArgs a = SplitArgsFor(head, r, s, col0, cols);
    FLCE_RETURN_IF_ERROR(LaunchSplitGrad(head.dtype, a, s.grad, exec.stream, exec.health));
    // dlogits sit at the start of each fp32 row: row stride cols * 4 bytes.
    const int64_t ld_d = cols * 4 / esize;
    if (r.grad_input != nullptr) {
      FLCE_RETURN_IF_ERROR(gemm.GradInput(s.logits, ld_d, w, r.rows, cols, head.hidden, s.gi32,
                                          DType::kF32, col0 == 0 ? 0.0f : 1.0f));
    }
    if (r.grad_weight != nullptr) {
      FLCE_RETURN_IF_ERROR(gemm.GradWeight(s.logits, ld_d, x, r.rows, cols, head.hidden,
                                           r.grad_weight + col0 * head.hidden));
    }
    if (r.grad_bias != nullptr) {
      FLCE_RETURN_IF_ERROR(gemm.GradBias(s.logits, ld_d, s.ones, r.rows, cols, r.grad_bias + col0));
    }
  }
  if (r.grad_input != nullptr) {
    FLCE_RETURN_IF_ERROR(LaunchConvert(DType::kF32, s.gi32, r.hidden_dtype, r.grad_input,
                                       r.rows * head.hidden, exec.stream, exec.health));
  }
  return absl::OkStatus();
}

}  // namespace flce::cuda::plan_parts
