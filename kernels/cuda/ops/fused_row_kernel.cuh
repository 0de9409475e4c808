// The chunked plan's row kernel: for each row of a token chunk's fp32 logits
// (bias not yet added), ONE launch computes the row's max / sum-exp, LSE,
// loss, z-loss, logprob, entropy and argmax (MATH.md, every option) and then
// overwrites the row with dlogits (x grad_scale, x a_t / e_t, x softcap and
// temperature factors) in the head's dtype, so that cuBLAS can use the same
// buffer for grad_input and grad_W. Never materialised: softmax
// probabilities, a second logits buffer, any (tokens x V) tensor beyond the
// chunk's. Padded columns (>= V) are skipped by every sum, max and argmax and
// get dlogits 0.
//
// The narrowing in-place write (fp32 in, bf16/fp16 out at the same row base,
// so dlogits row r starts where logits row r did) walks the row in tiles with
// one barrier per tile: a tile's narrow output only covers bytes of tiles
// already read by every thread.
//
// The naive plan uses the same kernel with a separate dlogits buffer and a
// softmax buffer, as autograd would materialise them.
#ifndef FLCE_KERNELS_CUDA_OPS_FUSED_ROW_KERNEL_CUH_
#define FLCE_KERNELS_CUDA_OPS_FUSED_ROW_KERNEL_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "core/dtype.h"
#include "kernels/cuda/base/cuda_status.h"
#include "kernels/cuda/base/row_types.h"

namespace flce::cuda {

struct FusedRowArgs {
  const float* logits = nullptr;  // rows x ld_logits fp32, row-major
  int64_t ld_logits = 0;          // in floats, >= padded V, multiple of 4
  int64_t padded_vocab = 0;       // columns present in each row (multiple of 4)
  int64_t rows = 0;
  const void* bias = nullptr;     // head dtype, padded_vocab entries, or null
  // dlogits in `dtype`; row r at (char*)dlogits + r * dlogits_row_bytes. May
  // equal `logits` (in place). Null = forward only.
  void* dlogits = nullptr;
  int64_t dlogits_row_bytes = 0;
  float* probs = nullptr;         // naive plan only: softmax, ld_logits stride
  RowInputs in;
  RowOutputs out;
  LossParams params;
};

// dtype is the head's (dlogits' and bias') dtype.
absl::Status LaunchFusedRows(DType dtype, const FusedRowArgs& args, cudaStream_t stream,
                             DeviceHealth* health);

}  // namespace flce::cuda

#endif  // FLCE_KERNELS_CUDA_OPS_FUSED_ROW_KERNEL_CUH_
