// Row kernels of the vocab-split plan (verl's split-N): the forward walks the
// vocabulary in column splits and keeps only a per-row online-softmax state
// (max, sum-exp, entropy partial, sum z, z_y, argmax: 32 bytes a row); a
// finalise step turns it into LSE and the per-row outputs; the backward
// recomputes each split's logits and overwrites them with dlogits in the
// head's dtype. Never materialised: logits for more than one split, softmax.
#ifndef FLCE_KERNELS_CUDA_OPS_SPLIT_ROW_KERNELS_CUH_
#define FLCE_KERNELS_CUDA_OPS_SPLIT_ROW_KERNELS_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "core/dtype.h"
#include "kernels/cuda/base/cuda_status.h"
#include "kernels/cuda/base/row_types.h"

namespace flce::cuda {

struct SplitArgs {
  float* logits = nullptr;  // rows x ld fp32; column c is vocabulary column col0 + c
  int64_t ld = 0;           // floats, multiple of 4
  int64_t col0 = 0;         // multiple of 4
  int64_t cols = 0;         // multiple of 4
  int64_t rows = 0;
  const void* bias = nullptr;  // head dtype, whole padded vocabulary, or null
  const int32_t* target = nullptr;
  LossParams params;
  // Columns at or past vocab_end are padding (params.vocab on one GPU; a
  // vocabulary shard's end in the whole vocabulary when W is split across
  // GPUs, where col0, targets and argmax stay whole-vocabulary columns).
  int64_t vocab_end = 0;
  int64_t bias_col0 = 0;  // the whole-vocabulary column of bias[0]
};

// state[r] = merge(state[r], split) (or = split when `first`).
absl::Status LaunchSplitStats(DType dtype, const SplitArgs& args, RowState* state, bool first,
                              cudaStream_t stream, DeviceHealth* health);

// out[r] = merge of parts[p * rows + r] over p = 0..count-1, in that order:
// the states of one row from each vocabulary shard.
absl::Status LaunchMergeStates(const RowState* parts, int count, int64_t rows, RowState* out,
                               cudaStream_t stream, DeviceHealth* health);

// grad[r] and the per-row outputs from the finished state.
absl::Status LaunchFinishRows(const RowState* state, int64_t rows, RowInputs in, RowOutputs out,
                              const LossParams& params, RowGrad* grad, cudaStream_t stream,
                              DeviceHealth* health);

// Overwrites the split's logits with dlogits in `dtype` (row r's dlogits start
// at row r's logits; row stride ld * 4 bytes).
absl::Status LaunchSplitGrad(DType dtype, const SplitArgs& args, const RowGrad* grad,
                             cudaStream_t stream, DeviceHealth* health);

}  // namespace flce::cuda

#endif  // FLCE_KERNELS_CUDA_OPS_SPLIT_ROW_KERNELS_CUH_
