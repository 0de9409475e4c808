// Row kernels that finish the logits-stats GEMM (logits_stats_gemm.cuh):
// merge each row's per-tile partials into LSE, the per-row outputs and the
// gradient coefficients, then turn the fp16 e = exp(z - m_t) in place into
// dlogits (p = e exp(m_t - LSE)) in the head's dtype. Each logit is read and
// written once, as 2 bytes.
#ifndef FLCE_KERNELS_CUDA_OPS_TILE_STATS_KERNELS_CUH_
#define FLCE_KERNELS_CUDA_OPS_TILE_STATS_KERNELS_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "core/dtype.h"
#include "kernels/cuda/base/cuda_status.h"
#include "kernels/cuda/base/row_types.h"
#include "kernels/cuda/ops/sm90/logits_stats_gemm.cuh"

namespace flce::cuda {

struct TileRowArgs {
  int64_t rows = 0;
  int64_t padded_vocab = 0;
  int64_t tiles = 0;  // LogitsStatsTiles(padded_vocab)
  // From the GEMM. The plain finish overwrites stats.max with exp(m_t - LSE),
  // the factor the gradient kernel applies to the tile's e (the row-scaled
  // finish leaves it).
  TileStats stats;
  const float* target_logit = nullptr;
  RowInputs in;
  RowOutputs out;
  LossParams params;            // plain logits: no softcap, temperature 1
  RowGrad* grad = nullptr;      // rows
  void* exp_dlogits = nullptr;  // rows x padded_vocab: fp16 e in, dlogits out
  // Both launches do nothing unless *run_if != 0; null = always run.
  const int32_t* run_if = nullptr;
  // Row-scaled finish (row_scaled_backward.cuh), selected by row_reference:
  // exp_dlogits holds bf16 exp(z - M_t); the finish writes K_t to row_scale,
  // rewrites each valid row's target entry as dz_y / K_t, and sets *fallback
  // for rows that cannot be scaled (they need the dlogits pass).
  const float* row_reference = nullptr;
  float* row_scale = nullptr;
  int32_t* fallback = nullptr;
  // The partials are sums around the row reference (PartialsAroundReference
  // of the GEMM's arguments): the finish adds the sums and reads the other
  // fields of the row's first tile only.
  bool sums_around_reference = false;
  // Columns at or past vocab_end are padding (params.vocab on one GPU, a
  // vocabulary shard's real columns when W is split across GPUs); the onehot
  // and argmax compare first_column + column with whole-vocabulary targets.
  int64_t vocab_end = 0;
  int64_t first_column = 0;
};

absl::Status LaunchTileFinish(const TileRowArgs& args, cudaStream_t stream, DeviceHealth* health);

// A head split across GPUs (plan_sharded.h). LaunchTileReduce: each row's
// tiles of this shard merged into one online-softmax state (argmax in
// whole-vocabulary columns; z_y from target_logit where args.in.target, the
// shard-local targets, is >= 0). LaunchTileFactors: after the shards' states
// are merged and the rows finished into args.grad, stats.max[t] =
// exp(m_t - LSE), as LaunchTileFinish leaves it. LaunchLocalTargets:
// out[t] = target[t] - first where that lies in [0, count), else -1.
absl::Status LaunchTileReduce(const TileRowArgs& args, RowState* state, cudaStream_t stream,
                              DeviceHealth* health);
absl::Status LaunchTileFactors(const TileRowArgs& args, cudaStream_t stream,
                               DeviceHealth* health);
absl::Status LaunchLocalTargets(const int32_t* target, int64_t n, int64_t first, int64_t count,
                                int32_t* out, cudaStream_t stream, DeviceHealth* health);

// dlogits in `dtype` (bf16 or fp16) over e, in place; 0 on padded columns.
absl::Status LaunchTileGrad(DType dtype, const TileRowArgs& args, cudaStream_t stream,
                            DeviceHealth* health);

}  // namespace flce::cuda

#endif  // FLCE_KERNELS_CUDA_OPS_TILE_STATS_KERNELS_CUH_
