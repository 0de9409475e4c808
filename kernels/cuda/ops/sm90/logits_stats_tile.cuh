// The logits-stats GEMM's shared pieces (logits_stats_gemm.cuh): the tile
// geometry, the kernels' arguments and tile order, and the epilogue steps
// both kernels take, the cooperative 128 x 256 one (logits_stats_gemm.cu) and
// the ping-pong 128 x 128 and 128 x 192 ones (logits_stats_pingpong.cu). Device code for
// sm_90a only; included by those two files alone.
#ifndef FLCE_KERNELS_CUDA_OPS_SM90_LOGITS_STATS_TILE_CUH_
#define FLCE_KERNELS_CUDA_OPS_SM90_LOGITS_STATS_TILE_CUH_

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/base/cuda_status.h"
#include "kernels/cuda/base/sm90_support.h"
#include "kernels/cuda/ops/sm90/logits_stats_gemm.cuh"
#include "kernels/cuda/ops/sm90/sm90_primitives.cuh"

namespace flce::cuda::logits_stats {

// 128 tokens per tile, 64 hidden columns per stage (one 128-byte swizzle row
// of 16-bit elements). Two consumer warpgroups; a third issues the TMA loads.
constexpr int kBM = 128;
constexpr int kBK = 64;
constexpr int kConsumers = 2;
constexpr int kThreads = 128 * (kConsumers + 1);

// e leaves through shared memory and TMA stores: written straight from the
// accumulator layout, each warp store instruction would touch 8 rows (16 bytes
// each), fill the store queue and stall the epilogue on its own registers. A
// consumer warpgroup stages 64 rows x 128 columns at a time, as two
// 64 x 64 boxes in the 128-byte swizzle (conflict-free for the fragment
// layout): 16 KiB per warpgroup, which is what is left beside the stages.
constexpr int kOutBox = 64;
constexpr int kOutBoxes = 2;  // per 128 columns

struct KernelArgs {
  int32_t rows;
  int32_t hidden;
  int32_t vocab;
  int32_t padded_vocab;
  int32_t m_tiles;
  int32_t n_tiles;
  int32_t m_group;  // token tiles per group of the tile order
  const int32_t* target;
  float* target_logit;
  TileStats stats;
  const float* row_reference;
  const int32_t* run_if;
};

// The tile order: groups of m_group token tiles, token tiles fastest within
// a group, a group's every W tile before the next group. The CTAs in flight
// share a few W tiles and the group's hidden rows (by default the group is
// the whole chunk: a few MiB at H = 1024). n_tiles: W tiles per row of
// tiles (the kernel's own width).
struct TileAt {
  int32_t m, n;
  __device__ TileAt(int32_t tile, const KernelArgs& a, int32_t n_tiles)
      : TileAt(tile, a.m_tiles, a.m_group, n_tiles) {}
  __device__ TileAt(int32_t tile, int32_t m_tiles, int32_t m_group, int32_t n_tiles) {
    const int32_t per_group = m_group * n_tiles;
    const int32_t group = tile / per_group;
    const int32_t rest = tile - group * per_group;
    const int32_t rows = min(m_group, m_tiles - group * m_group);
    m = group * m_group + rest % rows;
    n = rest / rows;
  }
};

// The tiles a CTA takes. Alone (kPair = 1): every gridDim.x-th from
// blockIdx.x in TileAt's order. In a cluster of two (kPair = 2): the pair
// takes every (gridDim.x / 2)-th pair of adjacent token tiles over one W
// tile, in TileAt's order over pairs, and the CTA of rank r its token tile
// 2 m + r; with an odd count the last pair's second tile lies past the
// chunk (no rows: computed, nothing written), so that both CTAs of a pair
// always go through the same stages.
template <int kPair>
struct CtaTiles {
  int32_t m_pairs, m_group, n_tiles, count, unit, units;
  uint32_t rank;
  __device__ CtaTiles(const KernelArgs& a, int32_t n_tiles_per_row)
      : m_pairs((a.m_tiles + kPair - 1) / kPair),
        m_group((a.m_group + kPair - 1) / kPair),
        n_tiles(n_tiles_per_row),
        count(m_pairs * n_tiles_per_row),
        unit(static_cast<int32_t>(blockIdx.x) / kPair),
        units(static_cast<int32_t>(gridDim.x) / kPair),
        rank(kPair == 1 ? 0u : blockIdx.x % kPair) {}
  __device__ TileAt At(int32_t index) const {
    TileAt t(index, m_pairs, m_group, n_tiles);
    t.m = t.m * kPair + static_cast<int32_t>(rank);
    return t;
  }
};

// A row-major rows x cols 16-bit tensor in boxes of 64 columns x box_rows.
inline absl::Status Encode(CUtensorMap* map, DType dtype, const void* base, int64_t rows,
                           int64_t cols, uint32_t box_rows) {
  return sm90::EncodeMatrix(map, dtype, base, rows, cols, kBK, box_rows);
}

#ifdef FLCE_SM90A
// The producer thread's loop: the CTA's tiles (CtaTiles), each as k-blocks
// of kBM hidden rows and kBN W rows, up to kStages ahead of the consumers.
// In a pair each CTA loads half the W rows into both CTAs (TMA multicast,
// w_map's boxes kBN / 2 rows), a stage is free once both CTAs' consumers
// have released it, and the producer waits for the last releases before
// its CTA may exit.
template <int kBN, int kStages, int kPair = 1, typename Tiles>
__device__ __forceinline__ void LoadTiles(Tiles& sm, const CUtensorMap* x_map,
                                          const CUtensorMap* w_map, const KernelArgs& a,
                                          int32_t n_tiles, int32_t k_blocks) {
  constexpr uint32_t kStageBytes = (kBM + kBN) * kBK * 2;
  constexpr int kHalfRows = kBN / kPair;
  const CtaTiles<kPair> tiles(a, n_tiles);
  sm90::StageCursor<kStages> at;
  for (int32_t index = tiles.unit; index < tiles.count; index += tiles.units) {
    const TileAt at_tile = tiles.At(index);
    for (int32_t kb = 0; kb < k_blocks; ++kb) {
      sm90::MbarWait(&sm.empty[at.stage], at.phase ^ 1);
      sm90::MbarExpectTx(&sm.full[at.stage], kStageBytes);
      sm90::TmaLoad(sm.a[at.stage], x_map, &sm.full[at.stage], kb * kBK, at_tile.m * kBM);
      if constexpr (kPair == 1) {
        sm90::TmaLoad(sm.b[at.stage], w_map, &sm.full[at.stage], kb * kBK, at_tile.n * kBN);
      } else {
        const int half = static_cast<int>(tiles.rank) * kHalfRows;
        sm90::TmaLoadMulticast(&sm.b[at.stage][half * kBK], w_map, &sm.full[at.stage], kb * kBK,
                               at_tile.n * kBN + half, (1u << kPair) - 1);
      }
      at.Next();
    }
  }
  if constexpr (kPair > 1) sm90::DrainStages(at, sm.empty);
}

// A consumer thread's two rows (row0 and row0 + 8): their targets (-1 past
// the chunk) and, with kRowRef, their reference logits (0 past the chunk).
// Loaded before the mainloop: the epilogue would otherwise wait for them.
template <bool kRowRef>
__device__ __forceinline__ void LoadRowInputs(const KernelArgs& a, int64_t row0, int32_t (&y)[2],
                                              float (&reference)[2]) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const bool in_chunk = row0 + 8 * r < a.rows;
    y[r] = in_chunk ? a.target[row0 + 8 * r] : -1;
    reference[r] = kRowRef && in_chunk ? a.row_reference[row0 + 8 * r] : 0.0f;
  }
}

__device__ __forceinline__ float Exp2Approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// The sum of v over the quad of lanes that hold one accumulator row (lanes
// 4q .. 4q + 3), in every lane of it: offset 1, then 2 (a fixed order, so the
// same rounding on every run).
__device__ __forceinline__ float QuadSum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// Padded columns of the last vocabulary tile (and columns past Vp) become a
// large negative logit: exp gives exactly 0, e * (z - m) gives 0 (-inf would
// give NaN), and they never equal the max.
constexpr float kMaskedLogit = -1e30f;

// One m64nN fragment's columns at or past `real` (offsets from the
// fragment's first column as this thread holds them; kFloats = N / 2).
template <int kFloats>
__device__ __forceinline__ void MaskColumns(float (&acc)[kFloats], int32_t real) {
#pragma unroll
  for (int v = 0; v < kFloats; ++v) {
    const int o = (v / 4) * 8 + (v & 1);
    if (o >= real) acc[v] = kMaskedLogit;
  }
}

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Writes packed e for kBoxes 64-column boxes of a consumer's 64 rows into
// its staging boxes and stores them (boxes starting at or past col_end, the
// padded vocabulary, hold only masked columns and are not stored): box i / 8,
// 16-byte chunk (i % 8) ^ (row % 8) of the row (the 128-byte swizzle; a
// thread's rows are lane / 4 and lane / 4 + 8 of its warp's 16, so
// row % 8 = lane / 4).
template <int kBoxes>
__device__ __forceinline__ void StageAndStore(const uint32_t (&packed)[16 * kBoxes],
                                              uint16_t (&boxes)[kBoxes][kOutBox * kOutBox],
                                              const CUtensorMap* e_map, int consumer, int col,
                                              int row, int col_end) {
  const int t = threadIdx.x % 128;
  const int lane = t % 32;
  const int local_row = (t / 32) * 16 + lane / 4;
  // The previous stores from these boxes must have read them.
  if (t == 0) sm90::TmaStoreWaitRead();
  sm90::WarpgroupSync(consumer);
#pragma unroll
  for (int i = 0; i < 8 * kBoxes; ++i) {
    const uint32_t box = sm90::SmemAddr(boxes[i / 8]);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const uint32_t byte =
          (local_row + 8 * r) * 128 + (((i % 8) ^ (lane / 4)) * 16) + (lane % 4) * 4;
      sm90::StoreShared(box + byte, packed[i * 2 + r]);
    }
  }
  sm90::FenceSharedForAsync();
  sm90::WarpgroupSync(consumer);
  if (t == 0) {
#pragma unroll
    for (int x = 0; x < kBoxes; ++x) {
      if (col + x * kOutBox < col_end) sm90::TmaStore(e_map, boxes[x], col + x * kOutBox, row);
    }
    sm90::TmaStoreCommit();
  }
}

// z_y, written by the one thread whose columns hold the row's target.
// acc: a thread's fragments of one row pair side by side, flat (kFloats / 4
// groups of 8 columns: element 4j + 2r + b is column 8j + b of row r).
template <int kFloats>
__device__ __forceinline__ void StoreTargetLogit(const float (&acc)[kFloats], int64_t row0,
                                                 int32_t col0, const int32_t (&y)[2],
                                                 const KernelArgs& a) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int32_t y_offset = y[r] - col0;
    if (y_offset >= 0 && y_offset < 2 * kFloats && (y_offset & 6) == 0) {
      float zy = 0.0f;
#pragma unroll
      for (int j = 0; j < kFloats / 4; ++j) {
#pragma unroll
        for (int b = 0; b < 2; ++b) {
          if (j * 8 + b == y_offset) zy = acc[j * 4 + 2 * r + b];
        }
      }
      a.target_logit[row0 + 8 * r] = zy;
    }
  }
}

// e = exp(z - M_t) for kGroups 64-column groups of a thread's two rows,
// packed as bf16 pairs, and the rows' sums over kSums equal runs of groups
// (the default call's epilogue: ReferenceEpilogue, one sum per row; the
// ping-pong kernel, one per group, since a 256-column partial may start
// inside its tile).
template <int kGroups, int kSums>
__device__ __forceinline__ void ReferenceExp(const float (&acc)[32 * kGroups],
                                             const float (&ref_log2)[2], float (&s)[kSums][2],
                                             uint32_t (&packed)[16 * kGroups]) {
  static_assert(kGroups % kSums == 0, "whole groups per sum");
#pragma unroll
  for (int i = 0; i < 8 * kGroups; ++i) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float e[2];
#pragma unroll
      for (int b = 0; b < 2; ++b) {
        e[b] = Exp2Approx(fmaf(acc[i * 4 + 2 * r + b], kLog2e, -ref_log2[r]));
        s[i / (8 * kGroups / kSums)][r] += e[b];
      }
      const __nv_bfloat162 pair = __floats2bfloat162_rn(e[0], e[1]);
      packed[i * 2 + r] = *reinterpret_cast<const uint32_t*>(&pair);
    }
  }
}
#endif  // FLCE_SM90A

// The default call (row-scaled e around the row reference, neither entropy
// nor accuracy) on the ping-pong kernel of `tile_cols` columns (128 or 192;
// the 192-column one in CTA pairs sharing W where args.pingpong_pairs); x_map
// and e_map as the cooperative kernel encodes them.
absl::Status LaunchPingPong(const LogitsStatsArgs& args, const CUtensorMap& x_map,
                            const CUtensorMap& e_map, const KernelArgs& k, int tile_cols,
                            cudaStream_t stream, DeviceHealth* health);

}  // namespace flce::cuda::logits_stats

#endif  // FLCE_KERNELS_CUDA_OPS_SM90_LOGITS_STATS_TILE_CUH_
