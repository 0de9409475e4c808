#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "kernels/cuda/base/row_math.cuh"
#include "kernels/cuda/ops/tile_stats_kernels.cuh"

namespace flce::cuda {
namespace {

constexpr int kFinishThreads = 128;
constexpr int kGradThreads = 256;
constexpr int kGradVec = 8;      // fp16/bf16 elements per 16-byte vector
constexpr int kGradVectors = 2;  // vectors per thread
// The grid-stride kernels' grid: a few waves of blocks on the largest GPUs,
// enough to stream, whatever the rows.
constexpr int64_t kMaxStrideBlocks = 4096;
static_assert(kLogitsStatsTileCols % (kGradVec * kGradVectors) == 0,
              "a thread's columns never straddle two tiles");

// K_t and the target entry of the row-scaled backward (row_scaled_backward.cuh),
// label smoothing 0: dz_j = coef (1 + 2 s LSE) p_j for j != y, and
// dz_y = coef (expm1(logprob) + p_y 2 s LSE).
__device__ __forceinline__ void RowScaledFinish(const TileRowArgs& a, int64_t row,
                                                const RowState& st, const RowGrad& g) {
  float scale = 0.0f;
  bool fallback = g.coef_entropy != 0.0f;  // per-element entropy terms
  if (g.coef_loss != 0.0f && !fallback) {
    const float reference = a.row_reference[row];
    const float zfac = 2.0f * a.params.z_loss_scale * g.lse;
    const float one_zfac = 1.0f + zfac;
    // LSE - M_t >= m_t - M_t for every tile: within the cap, no factor was
    // capped and no e of the row exceeds e^60 (the partials taken around
    // M_t itself cap nothing).
    if (!(g.lse - reference <= kRowReferenceCap) || !(fabsf(one_zfac) >= 1e-3f)) {
      fallback = true;  // the loss is above 60 nats, or K_t would lose the target's term
    } else {
      const float to_prob = expf(reference - g.lse);  // p_j = e_j to_prob
      scale = g.coef_loss * one_zfac * to_prob;
      const float target_term = expm1f(g.logprob) + expf(g.logprob) * zfac;
      static_cast<__nv_bfloat16*>(a.exp_dlogits)[row * a.padded_vocab + g.target] =
          __float2bfloat16_rn(target_term / (one_zfac * to_prob));
    }
  }
  a.row_scale[row] = scale;
  if (fallback) *a.fallback = 1;
}

// The row's tiles merged into one state (z_y left 0), in every thread.
// Thread i takes tiles i, i + kFinishThreads, ...: a warp's loads are
// adjacent words. MergeStates breaks argmax ties on the index, so the merge
// order does not decide them.
__device__ __forceinline__ RowState MergeRowTiles(const TileRowArgs& a, int64_t row,
                                                  RowState* scratch) {
  const int64_t base = row * a.tiles;
  RowState st = EmptyState();
  for (int64_t t = threadIdx.x; t < a.tiles; t += kFinishThreads) {
    RowState part;
    part.m = a.stats.max[base + t];
    part.s = a.stats.sum_exp[base + t];
    part.sez = a.stats.sez[base + t];
    part.sum_z = a.stats.sum_z[base + t];
    part.zy = 0.0f;
    part.amax_value = part.m;
    // The GEMM wrote no argmax unless the call asked for accuracy.
    part.amax_index = a.out.argmax != nullptr
                          ? static_cast<int32_t>(a.stats.argmax[base + t] + a.first_column)
                          : INT_MAX;
    part.pad = 0;
    st = MergeStates(st, part);
  }
  return BlockReduceState<kFinishThreads>(st, scratch);
}

// Partials around the row reference: every tile's max is the row's M_t (0
// on an ignored row) and its sez and sum_z are 0, so the merge of
// MergeRowTiles reduces to a sum of the tiles' sums.
__device__ __forceinline__ RowState SumRowTiles(const TileRowArgs& a, int64_t row, float* scratch) {
  const int64_t base = row * a.tiles;
  float s = 0.0f;
  for (int64_t t = threadIdx.x; t < a.tiles; t += kFinishThreads) s += a.stats.sum_exp[base + t];
  s = WarpSum(s);
  if ((threadIdx.x & 31) == 0) scratch[threadIdx.x / 32] = s;
  __syncthreads();
  RowState st = EmptyState();
  st.m = a.stats.max[base];
  st.s = scratch[0];
#pragma unroll
  for (int w = 1; w < kFinishThreads / 32; ++w) st.s += scratch[w];
  st.sez = a.stats.sez[base];
  st.sum_z = a.stats.sum_z[base];
  return st;
}

__global__ void __launch_bounds__(kFinishThreads) TileFinishKernel(TileRowArgs a) {
  if (a.run_if != nullptr && *a.run_if == 0) return;
  __shared__ RowState scratch[kFinishThreads / 32];
  __shared__ float sums[kFinishThreads / 32];
  __shared__ float row_lse;
  const int64_t row = blockIdx.x;
  RowState st =
      a.sums_around_reference ? SumRowTiles(a, row, sums) : MergeRowTiles(a, row, scratch);
  if (threadIdx.x == 0) {
    const int32_t y = a.in.target[row];
    st.zy = y >= 0 ? a.target_logit[row] : 0.0f;
    const RowGrad g = FinishRow(st, a.in, row, a.params, a.out);
    if (a.grad != nullptr) a.grad[row] = g;
    if (a.row_reference != nullptr) RowScaledFinish(a, row, st, g);
    row_lse = g.lse;
  }
  // The row-scaled backward reads no tile factors: where a chunk falls back
  // to the dlogits pass, the plain finish runs again and writes them.
  if (a.row_reference != nullptr) return;
  __syncthreads();
  const float lse = row_lse;
  const int64_t base = row * a.tiles;
  for (int64_t t = threadIdx.x; t < a.tiles; t += kFinishThreads) {
    a.stats.max[base + t] = expf(a.stats.max[base + t] - lse);
  }
}

__global__ void __launch_bounds__(kFinishThreads) TileReduceKernel(TileRowArgs a,
                                                                   RowState* state) {
  __shared__ RowState scratch[kFinishThreads / 32];
  const int64_t row = blockIdx.x;
  RowState st = MergeRowTiles(a, row, scratch);
  if (threadIdx.x == 0) {
    st.zy = a.in.target[row] >= 0 ? a.target_logit[row] : 0.0f;
    state[row] = st;
  }
}

// Grid-stride over every (row, tile) pair: the separate plan hands a split
// head all of a call's tokens at once, more rows than a grid's y extent holds.
__global__ void TileFactorsKernel(TileRowArgs a) {
  const int64_t total = a.rows * a.tiles;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += stride) {
    float* m = &a.stats.max[i];  // row-major: row * tiles + tile
    *m = expf(*m - a.grad[i / a.tiles].lse);
  }
}

__global__ void LocalTargetsKernel(const int32_t* target, int64_t n, int64_t first, int64_t count,
                                   int32_t* out) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= n) return;
  const int64_t local = static_cast<int64_t>(target[t]) - first;
  out[t] = target[t] >= 0 && local >= 0 && local < count ? static_cast<int32_t>(local) : -1;
}

template <typename T>
__device__ __forceinline__ uint32_t Pack2(float lo, float hi);
template <>
__device__ __forceinline__ uint32_t Pack2<__nv_bfloat16>(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}
template <>
__device__ __forceinline__ uint32_t Pack2<__half>(float lo, float hi) {
  __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

template <typename T>
__device__ __forceinline__ uint4 GradVector(const uint4 raw, int64_t j0, float f, const RowGrad& g,
                                            const TileRowArgs& a, const RowConsts& kc) {
  const __half* e = reinterpret_cast<const __half*>(&raw);
  float d[kGradVec];
#pragma unroll
  for (int k = 0; k < kGradVec; ++k) {
    const int64_t j = j0 + k;
    d[k] = 0.0f;
    if (j < a.vocab_end) {
      const float prob = __half2float(e[k]) * f;
      // z_j - m only feeds the entropy term, which vanishes with p_j.
      const float zm = (g.coef_entropy != 0.0f && prob > 0.0f) ? logf(prob) + (g.lse - g.m) : 0.0f;
      d[k] = ProbGrad(prob, zm, static_cast<int32_t>(j + a.first_column), g, a.params, kc);
    }
  }
  uint4 packed;
  packed.x = Pack2<T>(d[0], d[1]);
  packed.y = Pack2<T>(d[2], d[3]);
  packed.z = Pack2<T>(d[4], d[5]);
  packed.w = Pack2<T>(d[6], d[7]);
  return packed;
}

// Each thread owns kGradVectors adjacent 16-byte vectors and loads them all
// before using any: more bytes in flight per SM for this streaming pass.
// Blocks stride over (row, column block) pairs: a bounded grid, so that the
// row-scaled path's fallback launch, which returns at once in the common
// case, costs one wave of blocks rather than one block per 4096 logits.
template <typename T>
__global__ void __launch_bounds__(kGradThreads) TileGradKernel(TileRowArgs a, int64_t col_blocks) {
  if (a.run_if != nullptr && *a.run_if == 0) return;
  const RowConsts kc = MakeConsts(a.params);
  const int64_t work = col_blocks * a.rows;
  for (int64_t w = blockIdx.x; w < work; w += gridDim.x) {
    const int64_t row = w / col_blocks;
    const int64_t j0 = ((w % col_blocks) * kGradThreads + threadIdx.x) * kGradVec * kGradVectors;
    if (j0 >= a.padded_vocab) continue;
    uint4* slot = reinterpret_cast<uint4*>(static_cast<char*>(a.exp_dlogits) +
                                           (row * a.padded_vocab + j0) * 2);
    uint4 raw[kGradVectors];
#pragma unroll
    for (int v = 0; v < kGradVectors; ++v) raw[v] = slot[v];
    const RowGrad g = a.grad[row];
    const float f = a.stats.max[row * a.tiles + j0 / kLogitsStatsTileCols];
#pragma unroll
    for (int v = 0; v < kGradVectors; ++v) {
      slot[v] = GradVector<T>(raw[v], j0 + v * kGradVec, f, g, a, kc);
    }
  }
}

}  // namespace

absl::Status LaunchTileFinish(const TileRowArgs& args, cudaStream_t stream, DeviceHealth* health) {
  if (args.rows <= 0) return absl::OkStatus();
  TileFinishKernel<<<static_cast<unsigned>(args.rows), kFinishThreads, 0, stream>>>(args);
  FLCE_CUDA_RETURN_IF_ERROR(cudaGetLastError(), health);
  return absl::OkStatus();
}

absl::Status LaunchTileReduce(const TileRowArgs& args, RowState* state, cudaStream_t stream,
                              DeviceHealth* health) {
  if (args.rows <= 0) return absl::OkStatus();
  TileReduceKernel<<<static_cast<unsigned>(args.rows), kFinishThreads, 0, stream>>>(args, state);
  FLCE_CUDA_RETURN_IF_ERROR(cudaGetLastError(), health);
  return absl::OkStatus();
}

absl::Status LaunchTileFactors(const TileRowArgs& args, cudaStream_t stream,
                               DeviceHealth* health) {
  if (args.rows <= 0 || args.tiles <= 0) return absl::OkStatus();
  constexpr int kThreads = 128;
  const int64_t blocks = (args.rows * args.tiles + kThreads - 1) / kThreads;
  const dim3 grid(static_cast<unsigned>(std::min(blocks, kMaxStrideBlocks)));
  TileFactorsKernel<<<grid, kThreads, 0, stream>>>(args);
  FLCE_CUDA_RETURN_IF_ERROR(cudaGetLastError(), health);
  return absl::OkStatus();
}

absl::Status LaunchLocalTargets(const int32_t* target, int64_t n, int64_t first, int64_t count,
                                int32_t* out, cudaStream_t stream, DeviceHealth* health) {
  if (n <= 0) return absl::OkStatus();
  constexpr int kThreads = 256;
  LocalTargetsKernel<<<static_cast<unsigned>((n + kThreads - 1) / kThreads), kThreads, 0,
                       stream>>>(target, n, first, count, out);
  FLCE_CUDA_RETURN_IF_ERROR(cudaGetLastError(), health);
  return absl::OkStatus();
}

absl::Status LaunchTileGrad(DType dtype, const TileRowArgs& args, cudaStream_t stream,
                            DeviceHealth* health) {
  if (args.rows <= 0) return absl::OkStatus();
  if (args.padded_vocab % (kGradVec * kGradVectors) != 0) {
    return absl::InternalError("tile gradient kernel: unsupported shape");
  }
  constexpr int64_t kPerBlock = kGradThreads * kGradVec * kGradVectors;
  const int64_t col_blocks = (args.padded_vocab + kPerBlock - 1) / kPerBlock;
  const dim3 grid(static_cast<unsigned>(std::min(col_blocks * args.rows, kMaxStrideBlocks)));
  switch (dtype) {
    case DType::kBF16:
      TileGradKernel<__nv_bfloat16><<<grid, kGradThreads, 0, stream>>>(args, col_blocks);
      break;
    case DType::kF16:
      TileGradKernel<__half><<<grid, kGradThreads, 0, stream>>>(args, col_blocks);
      break;
    case DType::kF32:
      return absl::InternalError("tile gradient kernel: fp32 heads take the cuBLAS path");
  }
  FLCE_CUDA_RETURN_IF_ERROR(cudaGetLastError(), health);
  return absl::OkStatus();
}

}  // namespace flce::cuda
