// One token chunk through the CPU engine: logits = X W^T by sgemm into the
// shared workspace, the row pass on the pool (turning logits into dr in
// place), then grad_input = dr W and grad_W += dr^T X by sgemm (beta = 1) and
// grad_b += column sums of dr. The chunk's logits are the only V-wide buffer.
#ifndef FLCE_KERNELS_CPU_CHUNK_KERNEL_H_
#define FLCE_KERNELS_CPU_CHUNK_KERNEL_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cpu/cpu_context.h"
#include "kernels/cpu/cpu_grad_buffer.h"
#include "kernels/cpu/cpu_head.h"
#include "kernels/cpu/row_pass.h"

namespace flce::cpu {

struct ChunkArgs {
  int64_t rows = 0;                  // M tokens
  const float* hidden = nullptr;     // M x H, already in the head's dtype's values
  const int32_t* targets = nullptr;  // M; < 0 = ignored
  const double* token_weights = nullptr;    // M; a_t
  const double* entropy_weights = nullptr;  // M; e_t
  const PolicyObjective* policy = nullptr;  // set: policy_rows has M entries
  const PolicyRow* policy_rows = nullptr;
  bool want_grad_input = false;
  CpuGradBuffer* grad = nullptr;     // nullptr: no grad_W / grad_b
  RowStats* stats = nullptr;         // M out
};

// Runs with ctx.mu held by the caller. grad_input (when wanted) lands in
// ctx.grad_input, M x H fp32.
absl::Status RunChunk(CpuContext& ctx, const CpuHead& head, const LossOptions& options,
                      const ChunkArgs& args);

}  // namespace flce::cpu

#endif  // FLCE_KERNELS_CPU_CHUNK_KERNEL_H_
