#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cfloat>
#include <climits>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "kernels/cuda/base/sm90_support.h"
#include "kernels/cuda/ops/sm90/logits_stats_gemm.cuh"
#include "kernels/cuda/ops/sm90/logits_stats_tile.cuh"
#include "kernels/cuda/ops/sm90/sm90_primitives.cuh"

namespace flce::cuda {
namespace {

using namespace sm90;          // NOLINT: the kernel is written in these primitives
using namespace logits_stats;  // NOLINT: the tiles' shared pieces

// 128 tokens x 256 vocabulary columns per tile, 64 hidden columns per stage;
// the two consumer warpgroups own 64 rows each. Four stages of 48 KiB.
constexpr int kBN = static_cast<int>(kLogitsStatsTileCols);
constexpr int kStages = 4;

struct alignas(1024) SharedTiles {
  uint16_t a[kStages][kBM * kBK];
  uint16_t b[kStages][kBN * kBK];
  uint16_t out[kConsumers][kOutBoxes][kOutBox * kOutBox];
  uint64_t full[kStages];
  uint64_t empty[kStages];
};
constexpr size_t kSharedBytes = sizeof(SharedTiles) + 1024;  // + runtime 1 KiB alignment
static_assert(kSharedBytes <= 227 * 1024, "beyond Hopper's shared memory per block");
static_assert(kBN == 2 * kOutBoxes * kOutBox, "two halves of two boxes span a tile");

#ifdef FLCE_SM90A
// A thread's two m64n128 fragments of a row pair as one run of 128 floats
// (StoreTargetLogit's view: element 4j + 2r + b is column 8j + b).
using FlatFragments = const float[128];
__device__ __forceinline__ FlatFragments& Flat(const float (&acc)[2][64]) {
  return *static_cast<FlatFragments*>(static_cast<const void*>(&acc));
}

__device__ __forceinline__ void MaskPadding(float (&acc)[2][64], int32_t real) {
#pragma unroll
  for (int h = 0; h < 2; ++h) MaskColumns(acc[h], real - h * 128);
}

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

// One consumer thread's share of the tile epilogue: its two rows (r = 0:
// row lane/4, r = 1: row lane/4 + 8 of its warp's 16) processed together,
// so that two independent dependency chains interleave. Fragment layout
// (m64nNk16): acc[h][i*4 + 2*r + b] is the tile's column h*128 + 8i +
// 2(lane%4) + b. Per element: one max, an argmax compare and select, one
// FMA into the exp, one add, one FMA for sez (and the row scale); the target
// logit is looked for only by the one thread whose columns hold it. The first half's e is on its
// way out while the second half's is computed. kSumZ: label smoothing's sum z.
// kArgmax: the argmax (two of those instructions per element) only for calls
// that asked for accuracy.
template <bool kSumZ, bool kRowRef, bool kArgmax>
__device__ __forceinline__ void Epilogue(const float (&acc)[2][64], int64_t row0, int32_t n_tile,
                                         int32_t m_tile, int consumer, const int32_t (&y)[2],
                                         const float (&reference)[2], const KernelArgs& a,
                                         const CUtensorMap* e_map,
                                         uint16_t (&boxes)[kOutBoxes][kOutBox * kOutBox]) {
  const int lane = threadIdx.x & 31;
  const int32_t col0 = n_tile * kBN + (lane & 3) * 2;
  float m[2] = {-INFINITY, -INFINITY};
  float m_odd[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int h = 0; h < 2; ++h) {
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
  StoreTargetLogit(Flat(acc), row0, col0, y, a);
  // The lowest offset holding the max: offsets visited from the highest
  // down, so a plain select keeps the lowest (two instructions per element).
  int32_t first[2] = {INT_MAX, INT_MAX};
  if (kArgmax) {
#pragma unroll
    for (int h = 1; h >= 0; --h) {
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
  const int box_row = m_tile * kBM + consumer * 64;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    uint32_t packed[32];
    ExpHalf<kSumZ, kRowRef>(acc[h], m_log2, scale, s, sez, sz, packed);
    StageAndStore<kOutBoxes>(packed, boxes, e_map, consumer, n_tile * kBN + h * 128, box_row,
                             a.padded_vocab);
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t row = row0 + 8 * r;
    s[r] = QuadSum(s[r]);
    sez[r] = QuadSum(sez[r]);
    if (kSumZ) sz[r] = QuadSum(sz[r]);
    // Lowest column holding the max across the quad: offsets of different
    // lanes interleave, so compare absolute columns.
    int32_t idx = first[r] == INT_MAX ? INT_MAX : col0 + first[r];
    if (kArgmax) {
      idx = min(idx, __shfl_xor_sync(0xffffffffu, idx, 1));
      idx = min(idx, __shfl_xor_sync(0xffffffffu, idx, 2));
    }
    if (row < a.rows && (lane & 3) == 0) {
      const int64_t k = row * a.n_tiles + n_tile;
      a.stats.max[k] = m[r];
      a.stats.sum_exp[k] = s[r];
      a.stats.sez[k] = sez[r] * kLn2;
      a.stats.sum_z[k] = sz[r];
      if (kArgmax) a.stats.argmax[k] = idx;
    }
  }
}

// The row-scaled epilogue for calls that ask for neither entropy nor
// accuracy: e = exp(z - M_t) straight from the row's reference, its sum the
// only statistic. LSE needs no tile max when every tile shares M_t
// (m_t := M_t in the partials, s_t = sum_j exp(z_j - M_t)), and nothing
// else needs sum e (z - m): per logit one FMA, the exp, one add and half a
// pack and store, against seven instructions with the max, the row scale and
// the sez sum. Values are not capped here: the finish sends every row whose
// LSE lies more than kRowReferenceCap above M_t (its loss above 60 nats) to
// the fallback, so a stored e that is used is at most e^60. Ignored rows
// (y < 0; their reference is x . W_0) get e = 0 and neutral partials
// (m = 0, s = 1): their scale is 0, and 0 times an unbounded e would not
// be.
__device__ __forceinline__ void ReferenceEpilogue(const float (&acc)[2][64], int64_t row0,
                                                  int32_t n_tile, int32_t m_tile, int consumer,
                                                  const int32_t (&y)[2],
                                                  const float (&reference)[2], const KernelArgs& a,
                                                  const CUtensorMap* e_map,
                                                  uint16_t (&boxes)[kOutBoxes][kOutBox * kOutBox]) {
  const int lane = threadIdx.x & 31;
  const int32_t col0 = n_tile * kBN + (lane & 3) * 2;
  StoreTargetLogit(Flat(acc), row0, col0, y, a);
  // exp2(z log2(e) - inf) = 0 for ignored rows.
  const float ref_log2[2] = {y[0] >= 0 ? reference[0] * kLog2e : INFINITY,
                             y[1] >= 0 ? reference[1] * kLog2e : INFINITY};
  float s[1][2] = {{0.0f, 0.0f}};
  const int box_row = m_tile * kBM + consumer * 64;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    uint32_t packed[32];
    ReferenceExp<2, 1>(acc[h], ref_log2, s, packed);
    StageAndStore<kOutBoxes>(packed, boxes, e_map, consumer, n_tile * kBN + h * 128, box_row,
                             a.padded_vocab);
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t row = row0 + 8 * r;
    s[0][r] = QuadSum(s[0][r]);
    if (row < a.rows && (lane & 3) == 0) {
      const int64_t k = row * a.n_tiles + n_tile;
      const bool valid = y[r] >= 0;
      a.stats.max[k] = valid ? reference[r] : 0.0f;
      a.stats.sum_exp[k] = valid ? s[0][r] : 1.0f;
      a.stats.sez[k] = 0.0f;
      a.stats.sum_z[k] = 0.0f;
    }
  }
}
#endif  // FLCE_SM90A

// kStatsOnReference: ReferenceEpilogue (row-scaled e, no entropy, no
// accuracy) instead of Epilogue.
template <bool kHalf, bool kSumZ, bool kRowRef, bool kArgmax, bool kStatsOnReference>
__global__ void __launch_bounds__(kThreads, 1)
    LogitsStatsKernel(const __grid_constant__ CUtensorMap x_map,
                      const __grid_constant__ CUtensorMap w_map,
                      const __grid_constant__ CUtensorMap e_map, const KernelArgs a) {
#ifdef FLCE_SM90A
  if (a.run_if != nullptr && *a.run_if == 0) return;
  extern __shared__ uint8_t raw_shared[];
  SharedTiles& sm = AlignedShared<SharedTiles>(raw_shared);
  const int wg = threadIdx.x / 128;
  const int t = threadIdx.x % 128;
  const int32_t k_blocks = (a.hidden + kBK - 1) / kBK;
  const int32_t num_tiles = a.m_tiles * a.n_tiles;
  InitStageBarriers(sm.full, sm.empty, kConsumers);

  if (wg == 0) {
    // Producer: TMA loads run ahead of the consumers by up to kStages.
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
    if (t != 0) return;
    LoadTiles<kBN, kStages>(sm, &x_map, &w_map, a, a.n_tiles, k_blocks);
    return;
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
  const int c = wg - 1;
  const int warp = t / 32;
  const int lane = t % 32;
  StageCursor<kStages> at;
  float acc[2][64];
  for (int32_t tile = blockIdx.x; tile < num_tiles; tile += gridDim.x) {
    const TileAt at_tile(tile, a, a.n_tiles);
    const int32_t m_tile = at_tile.m;
    const int32_t n_tile = at_tile.n;
    const int64_t row0 = static_cast<int64_t>(m_tile) * kBM + c * 64 + warp * 16 + lane / 4;
    int32_t y[2];
    float reference[2];
    LoadRowInputs<kRowRef>(a, row0, y, reference);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int i = 0; i < 64; ++i) acc[h][i] = 0.0f;
    }
    ConsumeStages(at, sm.full, sm.empty, k_blocks, t == 0, [&](int stage) {
      // k advances 16 columns, 32 bytes along the K-major rows.
      const uint64_t a0 = SmemDescK(&sm.a[stage][c * 64 * kBK]);
      const uint64_t b0 = SmemDescK(&sm.b[stage][0]);
      const uint64_t b1 = SmemDescK(&sm.b[stage][128 * kBK]);
#pragma unroll
      for (int k = 0; k < kBK / 16; ++k) {
        const uint64_t da = DescAdvance(a0, k * 32);
        Wgmma<kHalf, false, false>(acc[0], da, DescAdvance(b0, k * 32));
        Wgmma<kHalf, false, false>(acc[1], da, DescAdvance(b1, k * 32));
      }
    });
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int i = 0; i < 64; ++i) KeepInRegisters(acc[h][i]);
    }
    const int32_t col0 = n_tile * kBN + (lane & 3) * 2;
    if (col0 + kBN - 2 >= a.vocab) MaskPadding(acc, a.vocab - col0);
    if (kStatsOnReference) {
      ReferenceEpilogue(acc, row0, n_tile, m_tile, c, y, reference, a, &e_map, sm.out[c]);
    } else {
      Epilogue<kSumZ, kRowRef, kArgmax>(acc, row0, n_tile, m_tile, c, y, reference, a, &e_map,
                                        sm.out[c]);
    }
  }
  // e must be in global memory before the kernel ends.
  if (t == 0) TmaStoreWaitAll();
#else
  __trap();  // built without sm_90a code: HeadFitsHopperKernels() is false there
#endif
}

template <bool kHalf, bool kSumZ, bool kRowRef, bool kArgmax, bool kStatsOnReference = false>
absl::Status Launch(const CUtensorMap& x_map, const CUtensorMap& w_map, const CUtensorMap& e_map,
                    const KernelArgs& k, cudaStream_t stream, DeviceHealth* health) {
  const cudaError_t allowed =
      AllowDynamicShared<LogitsStatsKernel<kHalf, kSumZ, kRowRef, kArgmax, kStatsOnReference>>(
          kSharedBytes);
  FLCE_CUDA_RETURN_IF_ERROR(allowed, health);
  const int64_t tiles = static_cast<int64_t>(k.m_tiles) * k.n_tiles;
  PersistentLaunch launch(tiles, /*cluster=*/1, kThreads, kSharedBytes, stream);
  FLCE_CUDA_RETURN_IF_ERROR(
      cudaLaunchKernelEx(launch.config(),
                         LogitsStatsKernel<kHalf, kSumZ, kRowRef, kArgmax, kStatsOnReference>,
                         x_map, w_map, e_map, k),
      health);
  return absl::OkStatus();
}

}  // namespace

absl::Status LaunchLogitsStats(DType dtype, const LogitsStatsArgs& args, cudaStream_t stream,
                               DeviceHealth* health) {
  if (args.rows == 0) return absl::OkStatus();
  if (args.hidden % 8 != 0 || args.padded_vocab % 128 != 0 || args.vocab > args.padded_vocab ||
      args.rows > INT32_MAX / 2 || args.padded_vocab > INT32_MAX / 2) {
    return absl::InternalError("logits-stats GEMM: unsupported layout");
  }
  if (reinterpret_cast<uintptr_t>(args.exp_out) % 16 != 0) {
    return absl::InternalError("logits-stats GEMM: e buffer not 16-byte aligned");
  }
  static_assert(kBK == kOutBox, "the e boxes reuse the operands' 64-column encoding");
  CUtensorMap x_map, w_map, e_map;
  FLCE_RETURN_IF_ERROR(Encode(&x_map, dtype, args.x, args.rows, args.hidden, kBM));
  FLCE_RETURN_IF_ERROR(Encode(&w_map, dtype, args.w, args.padded_vocab, args.hidden, kBN));
  FLCE_RETURN_IF_ERROR(Encode(&e_map, args.row_reference != nullptr ? DType::kBF16 : DType::kF16,
                              args.exp_out, args.rows, args.padded_vocab, kOutBox));
  KernelArgs k;
  k.rows = static_cast<int32_t>(args.rows);
  k.hidden = static_cast<int32_t>(args.hidden);
  k.vocab = static_cast<int32_t>(args.vocab);
  k.padded_vocab = static_cast<int32_t>(args.padded_vocab);
  k.m_tiles = static_cast<int32_t>((args.rows + kBM - 1) / kBM);
  k.n_tiles = static_cast<int32_t>(LogitsStatsTiles(args.padded_vocab));
  // Groups of G token tiles keep G x 128 hidden rows in L2 while the group
  // sweeps W; one group is the whole chunk, token tiles fastest.
  k.m_group = args.token_tiles_per_group > 0 && args.token_tiles_per_group < k.m_tiles
                  ? args.token_tiles_per_group
                  : k.m_tiles;
  k.target = args.target;
  k.target_logit = args.target_logit;
  k.stats = args.stats;
  k.row_reference = args.row_reference;
  k.run_if = args.run_if;
  if (args.row_reference != nullptr) {
    // Row-scaled e feeds cuBLAS next to W, so it takes W's dtype: bf16 (fp16's
    // range would not hold exp(z - M_t)).
    if (dtype != DType::kBF16 || args.sum_z) {
      return absl::InternalError("logits-stats GEMM: row-scaled e needs bf16 and no sum z");
    }
    if (args.argmax) {
      return Launch<false, false, true, true>(x_map, w_map, e_map, k, stream, health);
    }
    if (PartialsAroundReference(args)) {
      if (const int cols = PingPongColsFor(args); cols > 0) {
        return LaunchPingPong(args, x_map, e_map, k, cols, stream, health);
      }
      return Launch<false, false, true, false, true>(x_map, w_map, e_map, k, stream, health);
    }
    return Launch<false, false, true, false>(x_map, w_map, e_map, k, stream, health);
  }
  // With label smoothing the argmax always comes along: two fewer builds of
  // a kernel that compiles slowly.
  if (args.sum_z) {
    return dtype == DType::kF16
               ? Launch<true, true, false, true>(x_map, w_map, e_map, k, stream, health)
               : Launch<false, true, false, true>(x_map, w_map, e_map, k, stream, health);
  }
  if (dtype == DType::kF16) {
    return args.argmax ? Launch<true, false, false, true>(x_map, w_map, e_map, k, stream, health)
                       : Launch<true, false, false, false>(x_map, w_map, e_map, k, stream, health);
  }
  return args.argmax ? Launch<false, false, false, true>(x_map, w_map, e_map, k, stream, health)
                     : Launch<false, false, false, false>(x_map, w_map, e_map, k, stream, health);
}

}  // namespace flce::cuda
