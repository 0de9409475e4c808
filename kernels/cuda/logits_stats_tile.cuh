// Pieces shared by the two logits-stats GEMM kernels (logits_stats_gemm.cu:
// 128 x 256 tiles, both consumer warpgroups on one tile; logits_stats_pingpong.cu:
// 128 x 128 tiles, the warpgroups in turns): the kernel arguments, the operand
// and output encodings, and the epilogue that turns a tile's fp32
// accumulators into fp16 e = exp(z - m_t) and per-row partials.
#ifndef FLCE_KERNELS_CUDA_LOGITS_STATS_TILE_CUH_
#define FLCE_KERNELS_CUDA_LOGITS_STATS_TILE_CUH_

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cfloat>
#include <climits>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cuda/logits_stats_gemm.cuh"
#include "kernels/cuda/sm90_primitives.cuh"
#include "kernels/cuda/sm90_support.h"
#include "kernels/status_macros.h"

namespace flce::cuda::logits_stats {

using namespace sm90;  // NOLINT: the kernels are written in these primitives

// 128 tokens per tile, 64 hidden columns per stage (one 128-byte swizzle row
// of 16-bit elements); a producer warpgroup and two consumer warpgroups.
constexpr int kBM = 128;
constexpr int kBK = 64;
constexpr int kConsumers = 2;
constexpr int kThreads = 128 * (kConsumers + 1);

// e leaves through shared memory and TMA stores: written straight from the
// accumulator layout, each warp store instruction would touch 8 rows (16 bytes
// each), fill the store queue and stall the epilogue on its own registers. A
// consumer warpgroup stages 64 rows x 128 columns at a time, as two 64 x 64
// boxes in the 128-byte swizzle (conflict-free for the fragment layout).
constexpr int kOutBox = 64;
constexpr int kOutBoxes = 2;
static_assert(kBK == kOutBox, "the e boxes reuse the operands' 64-column encoding");

struct KernelArgs {
  int32_t rows;
  int32_t hidden;
  int32_t vocab;
  int32_t padded_vocab;
  int32_t m_tiles;
  int32_t n_tiles;
  int32_t m_group;  // token tiles per group of the tile order (cooperative kernel)
  const int32_t* target;
  float* target_logit;
  TileStats stats;
  const float* row_reference;
  const int32_t* run_if;
};

// The operand maps and arguments of one launch.
struct Launch {
  CUtensorMap x_map;  // hidden, boxes of kBM rows (x_half_map: kBM / 2 rows)
  CUtensorMap x_half_map;
  CUtensorMap w_map;  // W, boxes of one tile's columns
  CUtensorMap e_map;  // e out, 64 x 64 boxes
  KernelArgs k;
};

// A row-major rows x cols 16-bit tensor in boxes of 64 columns x box_rows.
inline absl::Status Encode(CUtensorMap* map, DType dtype, const void* base, int64_t rows,
                           int64_t cols, uint32_t box_rows) {
  return sm90::EncodeMatrix(map, dtype, base, rows, cols, kBK, box_rows);
}

inline absl::StatusOr<Launch> PrepareLaunch(DType dtype, const LogitsStatsArgs& args,
                                            int64_t tile_cols) {
  Launch l;
  FLCE_RETURN_IF_ERROR(Encode(&l.x_map, dtype, args.x, args.rows, args.hidden, kBM));
  FLCE_RETURN_IF_ERROR(Encode(&l.x_half_map, dtype, args.x, args.rows, args.hidden, kBM / 2));
  FLCE_RETURN_IF_ERROR(Encode(&l.w_map, dtype, args.w, args.padded_vocab, args.hidden,
                              static_cast<uint32_t>(tile_cols)));
  FLCE_RETURN_IF_ERROR(Encode(&l.e_map,
                              args.row_reference != nullptr ? DType::kBF16 : DType::kF16,
                              args.exp_out, args.rows, args.padded_vocab, kOutBox));
  KernelArgs& k = l.k;
  k.rows = static_cast<int32_t>(args.rows);
  k.hidden = static_cast<int32_t>(args.hidden);
  k.vocab = static_cast<int32_t>(args.vocab);
  k.padded_vocab = static_cast<int32_t>(args.padded_vocab);
  k.m_tiles = static_cast<int32_t>((args.rows + kBM - 1) / kBM);
  k.n_tiles = static_cast<int32_t>(LogitsStatsTiles(args.padded_vocab, tile_cols));
  k.m_group = k.m_tiles;
  k.target = args.target;
  k.target_logit = args.target_logit;
  k.stats = args.stats;
  k.row_reference = args.row_reference;
  k.run_if = args.run_if;
  return l;
}

// The ping-pong kernel's launch (logits_stats_pingpong.cu).
absl::Status LaunchPingPong(DType dtype, bool sum_z, const Launch& l, cudaStream_t stream,
                            DeviceHealth* health);

#ifdef FLCE_SM90A

__device__ __forceinline__ float Exp2Approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Padded columns of the last vocabulary tile (and columns past Vp) become a
// large negative logit: exp gives exactly 0, e * (z - m) gives 0 (-inf would
// give NaN), and they never equal the max. acc[h] starts at column
// h * kHalfStride of the tile (0 where the two sets are row halves).
constexpr float kMaskedLogit = -1e30f;

template <int kHalfStride>
__device__ __forceinline__ void MaskPadding(float (&acc)[2][64], int32_t real) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
#pragma unroll
    for (int v = 0; v < 64; ++v) {
      const int o = h * kHalfStride + (v / 4) * 8 + (v & 1);
      if (o >= real) acc[h][v] = kMaskedLogit;
    }
  }
}

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// e = exp(z - m) for one half (128 columns) of a thread's accumulators,
// packed as fp16 pairs (kRowRef: e * scale as bf16 pairs), with the row sums,
// sum e (z - m) and sum z folded in along the way. z - m is taken in log2
// units, d2 = z log2(e) - m log2(e), one FMA that feeds both the exp and the
// sez sum (scaled back by ln 2 once per row).
template <bool kSumZ, bool kRowRef>
__device__ __forceinline__ void ExpHalf(const float (&acc)[64], const float (&m_log2)[2],
                                        const float (&scale)[2], float (&s)[2], float (&sez)[2],
                                        float (&sz)[2], uint32_t (&packed)[32]) {
#pragma unroll
  for (int i = 0; i < 16; ++i) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float e[2];
#pragma unroll
      for (int b = 0; b < 2; ++b) {
        const float z = acc[i * 4 + 2 * r + b];
        const float d2 = fmaf(z, kLog2e, -m_log2[r]);
        e[b] = Exp2Approx(d2);
        s[r] += e[b];
        sez[r] = fmaf(e[b], d2, sez[r]);
        if (kSumZ) sz[r] += z > kMaskedLogit ? z : 0.0f;
      }
      if (kRowRef) {
        const __nv_bfloat162 pair = __floats2bfloat162_rn(e[0] * scale[r], e[1] * scale[r]);
        packed[i * 2 + r] = *reinterpret_cast<const uint32_t*>(&pair);
      } else {
        const __half2 pair = __floats2half2_rn(e[0], e[1]);
        packed[i * 2 + r] = *reinterpret_cast<const uint32_t*>(&pair);
      }
    }
  }
}

// Writes one half's packed e into the warpgroup's two staging boxes and
// stores them: box i / 8, 16-byte chunk (i % 8) ^ (row % 8) of the row (the
// 128-byte swizzle; a thread's rows are lane / 4 and lane / 4 + 8 of its
// warp's 16, so row % 8 = lane / 4).
__device__ __forceinline__ void StageAndStore(const uint32_t (&packed)[32],
                                              uint16_t (&boxes)[kOutBoxes][kOutBox * kOutBox],
                                              const CUtensorMap* e_map, int consumer, int col,
                                              int row) {
  const int t = threadIdx.x % 128;
  const int lane = t % 32;
  const int local_row = (t / 32) * 16 + lane / 4;
  // The previous stores from these boxes must have read them.
  if (t == 0) TmaStoreWaitRead();
  WarpgroupSync(consumer);
  const uint32_t box0 = SmemAddr(boxes[0]);
  const uint32_t box1 = SmemAddr(boxes[1]);
#pragma unroll
  for (int i = 0; i < 16; ++i) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const uint32_t byte =
          (local_row + 8 * r) * 128 + (((i % 8) ^ (lane / 4)) * 16) + (lane % 4) * 4;
      StoreShared(((i / 8) == 0 ? box0 : box1) + byte, packed[i * 2 + r]);
    }
  }
  FenceSharedForAsync();
  WarpgroupSync(consumer);
  if (t == 0) {
#pragma unroll
    for (int x = 0; x < kOutBoxes; ++x) TmaStore(e_map, boxes[x], col + x * kOutBox, row);
    TmaStoreCommit();
  }
}

// One consumer thread's share of the epilogue of 64 rows x kHalves * 128
// columns: its two rows (r = 0: row lane/4, r = 1: row lane/4 + 8 of its
// warp's 16) processed together, so that two independent dependency chains
// interleave. Fragment layout (m64n128k16): acc[h][i*4 + 2*r + b] is column
// h*128 + 8i + 2(lane%4) + b of the tile. Per element: one max, an argmax
// compare and select, one FMA into the exp, one add, one FMA for sez (and the
// row scale); the target logit is looked for only by the one thread whose
// columns hold it. One 128-column half's e is on its way out while the next
// is computed. kSumZ: label smoothing's sum z.
template <int kHalves, bool kSumZ, bool kRowRef>
__device__ __forceinline__ void TileEpilogue(const float (&acc)[kHalves][64], int64_t row0,
                                             int32_t n_tile, int32_t box_row, int consumer,
                                             const int32_t (&y)[2], const float (&reference)[2],
                                             const KernelArgs& a, const CUtensorMap* e_map,
                                             uint16_t (&boxes)[kOutBoxes][kOutBox * kOutBox]) {
  constexpr int kCols = kHalves * 128;
  const int lane = threadIdx.x & 31;
  const int32_t col0 = n_tile * kCols + (lane & 3) * 2;
  float m[2] = {-INFINITY, -INFINITY};
  float m_odd[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int h = 0; h < kHalves; ++h) {
#pragma unroll
    for (int i = 0; i < 16; ++i) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        m[r] = fmaxf(m[r], acc[h][i * 4 + 2 * r]);
        m_odd[r] = fmaxf(m_odd[r], acc[h][i * 4 + 2 * r + 1]);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    m[r] = fmaxf(m[r], m_odd[r]);
    m[r] = fmaxf(m[r], __shfl_xor_sync(0xffffffffu, m[r], 1));
    m[r] = fmaxf(m[r], __shfl_xor_sync(0xffffffffu, m[r], 2));
  }
  // The target logit first: the accumulators die as e is computed.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int32_t y_offset = y[r] - col0;
    if (y_offset >= 0 && y_offset < kCols && (y_offset & 6) == 0) {
      float zy = 0.0f;
#pragma unroll
      for (int h = 0; h < kHalves; ++h) {
#pragma unroll
        for (int i = 0; i < 16; ++i) {
#pragma unroll
          for (int b = 0; b < 2; ++b) {
            if (h * 128 + i * 8 + b == y_offset) zy = acc[h][i * 4 + 2 * r + b];
          }
        }
      }
      a.target_logit[row0 + 8 * r] = zy;
    }
  }
  // The lowest offset holding the max: offsets visited from the highest
  // down, so a plain select keeps the lowest (two instructions per element).
  int32_t first[2] = {INT_MAX, INT_MAX};
#pragma unroll
  for (int h = kHalves - 1; h >= 0; --h) {
#pragma unroll
    for (int i = 15; i >= 0; --i) {
#pragma unroll
      for (int b = 1; b >= 0; --b) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          first[r] = acc[h][i * 4 + 2 * r + b] == m[r] ? h * 128 + i * 8 + b : first[r];
        }
      }
    }
  }
  float s[2] = {0.0f, 0.0f}, sez[2] = {0.0f, 0.0f}, sz[2] = {0.0f, 0.0f};
  const float m_log2[2] = {m[0] * kLog2e, m[1] * kLog2e};
  // kRowRef: e relative to the row's reference, exp(m_t - M) capped (the
  // finish sends rows whose max lies further above M to the fallback).
  float scale[2] = {1.0f, 1.0f};
  if (kRowRef) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      scale[r] = Exp2Approx(fminf(m[r] - reference[r], kRowReferenceCap) * kLog2e);
    }
  }
#pragma unroll
  for (int h = 0; h < kHalves; ++h) {
    uint32_t packed[32];
    ExpHalf<kSumZ, kRowRef>(acc[h], m_log2, scale, s, sez, sz, packed);
    StageAndStore(packed, boxes, e_map, consumer, n_tile * kCols + h * 128, box_row);
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t row = row0 + 8 * r;
#pragma unroll
    for (int off = 1; off <= 2; off <<= 1) {
      s[r] += __shfl_xor_sync(0xffffffffu, s[r], off);
      sez[r] += __shfl_xor_sync(0xffffffffu, sez[r], off);
      if (kSumZ) sz[r] += __shfl_xor_sync(0xffffffffu, sz[r], off);
    }
    // Lowest column holding the max across the quad: offsets of different
    // lanes interleave, so compare absolute columns.
    int32_t idx = first[r] == INT_MAX ? INT_MAX : col0 + first[r];
    idx = min(idx, __shfl_xor_sync(0xffffffffu, idx, 1));
    idx = min(idx, __shfl_xor_sync(0xffffffffu, idx, 2));
    if (row < a.rows && (lane & 3) == 0) {
      const int64_t k = row * a.n_tiles + n_tile;
      a.stats.max[k] = m[r];
      a.stats.sum_exp[k] = s[r];
      a.stats.sez[k] = sez[r] * kLn2;
      a.stats.sum_z[k] = sz[r];
      a.stats.argmax[k] = idx;
    }
  }
}

// The rows' targets (and row references), loaded before the mainloop: the
// epilogue would otherwise wait for them. row0 is the thread's first row.
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
#endif  // FLCE_SM90A

}  // namespace flce::cuda::logits_stats

#endif  // FLCE_KERNELS_CUDA_LOGITS_STATS_TILE_CUH_
