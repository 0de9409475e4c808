// The chunked plan's logits GEMM with the row statistics in its epilogue
// (Hopper, sm_90a: TMA loads and stores, wgmma, warp-specialised
// producer/consumers).
//
// For each (128-token x 256-column) tile the fp32 accumulators never leave
// registers: the epilogue takes the tile's per-row max m_t, writes
// e = exp(z - m_t) as fp16 (relative rounding 2^-11, independent of |z|; a
// 16-bit copy of z itself would round a logit of 30 by 0.06) and the tile's
// partial statistics (sum e, sum e (z - m_t), sum z, first argmax when the
// call asked for accuracy) in fp32.
// The row's LSE then comes from the partials alone, so the logits are never
// stored in fp32 nor read twice: half the bytes per logit of the fp32 path
// and twice the tokens per chunk for the same workspace.
//
// Two kernels (logits_stats_tile.cuh): the cooperative one above, and for
// calls that ask for neither entropy nor accuracy a ping-pong one of 128- or
// 192-column tiles whose epilogues run beside the other warpgroup's MMAs
// (each tile adds its row sums into the 256-column partials it falls in).
//
// Only for plain logits (no bias, softcap or temperature), bf16/fp16 heads,
// H a multiple of 8 (TMA's 16-byte strides), on a device of compute
// capability 9.0; everything else takes the cuBLAS path.
#ifndef FLCE_KERNELS_CUDA_OPS_SM90_LOGITS_STATS_GEMM_CUH_
#define FLCE_KERNELS_CUDA_OPS_SM90_LOGITS_STATS_GEMM_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "core/dtype.h"
#include "kernels/cuda/base/cuda_status.h"

namespace flce::cuda {

// Per (row, vocab tile) partials, row-major with `tiles` entries per row.
struct TileStats {
  float* max = nullptr;       // m_t over the tile's real columns
  float* sum_exp = nullptr;   // sum exp(z - m_t)
  float* sez = nullptr;       // sum exp(z - m_t) (z - m_t)
  float* sum_z = nullptr;     // sum z
  int32_t* argmax = nullptr;  // lowest column index with z == m_t (only with args.argmax)
};

struct LogitsStatsArgs {
  const void* x = nullptr;  // rows x hidden, head dtype, row-major
  const void* w = nullptr;  // padded_vocab x hidden, head dtype
  int64_t rows = 0;
  int64_t hidden = 0;
  int64_t vocab = 0;                // real V: later columns are padding
  int64_t padded_vocab = 0;         // multiple of 128
  void* exp_out = nullptr;          // rows x padded_vocab fp16: exp(z - m_t), 0 on padding
  const int32_t* target = nullptr;  // rows, -1 = ignored
  float* target_logit = nullptr;    // rows: z_y, written by the tile holding y
  TileStats stats;                  // stats.sum_z written as 0 unless sum_z
  bool sum_z = false;               // label smoothing needs sum z
  bool argmax = true;               // stats.argmax written (the call asked for accuracy)
  bool entropy = true;              // stats.sez needed (the call asked for entropy)
  // Row-scaled e (row_scaled_backward.cuh): with a reference M_t per row,
  // exp_out holds bf16 exp(z - M_t) instead (the tile's factor exp(m_t - M_t)
  // capped at e^60), one scale per row away from dlogits. Without entropy and
  // argmax the partials are taken around M_t itself (m_t = M_t, sez = 0) and
  // e is not capped: the finish's fallback bounds it.
  const float* row_reference = nullptr;
  // The launch does nothing unless *run_if != 0 (a fallback decided on the
  // device); null = always run.
  const int32_t* run_if = nullptr;
  // false: nothing reads e after the finish (a call without a backward), so
  // a kernel may leave exp_out unwritten; the ping-pong kernel does.
  bool store_e = true;
  // The plan's choices (kernel_choices.h): for the default call (partials
  // around the row reference), the ping-pong kernel of this many columns
  // (0: the cooperative kernel), in CTA pairs or not; token tiles per group
  // (0: the whole chunk).
  int pingpong_cols = 0;
  bool pingpong_pairs = false;
  int32_t token_tiles_per_group = 0;
};

// The partials the GEMM writes for `args` are taken around the row reference
// (m_t = M_t, sez = 0, sum_z = 0 for a valid row): the finish needs only
// their sums.
inline bool PartialsAroundReference(const LogitsStatsArgs& args) {
  return args.row_reference != nullptr && !args.entropy && !args.argmax && !args.sum_z;
}

// The ping-pong kernel's columns LaunchLogitsStats runs `args` on, 0 for the
// cooperative kernel: the default call's first launch (not a fallback's).
inline int PingPongColsFor(const LogitsStatsArgs& args) {
  return PartialsAroundReference(args) && args.run_if == nullptr ? args.pingpong_cols : 0;
}

// Row-scaled e stores exp(z - M_t) with the tile's factor exp(m_t - M_t)
// capped at e^kRowReferenceCap: bf16 and fp32 sums of such values stay far
// from overflow. A row whose LSE lies further above M_t (a loss above 60
// nats) cannot use the row-scaled backward (its finish raises the fallback).
inline constexpr float kRowReferenceCap = 60.0f;

// Vocabulary columns per tile, and tiles per row (the partials' row length).
inline constexpr int64_t kLogitsStatsTileCols = 256;
inline int64_t LogitsStatsTiles(int64_t padded_vocab) {
  return (padded_vocab + kLogitsStatsTileCols - 1) / kLogitsStatsTileCols;
}

absl::Status LaunchLogitsStats(DType dtype, const LogitsStatsArgs& args, cudaStream_t stream,
                               DeviceHealth* health);

}  // namespace flce::cuda

#endif  // FLCE_KERNELS_CUDA_OPS_SM90_LOGITS_STATS_GEMM_CUH_
