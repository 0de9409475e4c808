// The ping-pong logits-stats kernel (logits_stats_tile.cuh) and its launch.
#include <cuda.h>
#include <cuda_bf16.h>

#include <algorithm>

#include "core/status_macros.h"
#include "kernels/cuda/base/kernel_choices.h"
#include "kernels/cuda/base/sm90_support.h"
#include "kernels/cuda/ops/sm90/logits_stats_gemm.cuh"
#include "kernels/cuda/ops/sm90/logits_stats_tile.cuh"
#include "kernels/cuda/ops/sm90/sm90_primitives.cuh"

namespace flce::cuda::logits_stats {
namespace {

using namespace sm90;  // NOLINT: the kernel is written in these primitives

// The ping-pong kernel, for the default call (row-scaled e around the row
// reference, neither entropy nor accuracy): 128 tokens x kBN vocabulary
// columns per tile (128 or 192), each consumer warpgroup owning whole tiles,
// the two taking the tensor cores in turns. A warpgroup issues its tile's
// MMAs once the other has issued all of its previous tile's, then runs its
// epilogue while the other's MMAs run: the tensor cores do not idle through
// epilogues, which at H = 1024 take a fifth of the cooperative kernel's
// time. Each stage is consumed by one warpgroup. The partials keep the
// cooperative kernel's 256-column layout: every tile adds its row sums into
// the one or two partials its columns fall in (zeroed before the launch).
// Each partial receives exactly two sums (the tiles holding its first and
// its last column: at 128 columns two tiles per partial, at 192 four tiles
// per three partials, the middle two straddling a boundary), and two adds
// onto zero give a + b whichever lands first: the result is repeatable.
// 192 columns take a sixth fewer bytes per flop from L2 than 128 and need
// 192 accumulator registers per thread (two m64n192 fragments). In CTA
// pairs (kPair = 2, a cluster of two over adjacent token tiles of one W
// tile: CtaTiles) each CTA loads half of every W tile into both by TMA
// multicast: 30% fewer bytes from L2 per flop at 192 columns. Without
// kStoreE (a call without a backward) e stays in registers: the stats are
// the same, and the DRAM writes of e go.
template <int kBN>
struct PingPong {
  static constexpr int kFloats = kBN / 2;  // a thread's accumulators per 64-row half
  static constexpr int kBoxes = kBN / kOutBox;
  // Six 32 KiB stages at 128 columns, four 40 KiB ones at 192, beside the
  // warpgroups' staging boxes (16 / 24 KiB each).
  static constexpr int kStages = kBN == 128 ? 6 : 4;
  // 192 accumulators and the epilogue's packed e need 240 registers per
  // consumer thread (232 spill); the producer's loop fits in 24.
  // 24 x 128 + 240 x 256 = 64512 of the 65536.
  static constexpr int kProducerRegisters = kBN == 128 ? 40 : 24;
  static constexpr int kConsumerRegisters = kBN == 128 ? 232 : 240;
  static_assert(kBN == 128 || kBN == 192, "the tile widths the kernel is built for");

  struct alignas(1024) SharedTiles {
    uint16_t a[kStages][kBM * kBK];
    uint16_t b[kStages][kBN * kBK];
    uint16_t out[kConsumers][kBoxes][kOutBox * kOutBox];
    uint64_t full[kStages];
    uint64_t empty[kStages];
    // A warpgroup has issued every MMA of its current tile: the other's turn.
    uint64_t issued[kConsumers];
  };
  static constexpr size_t kSharedBytes = sizeof(SharedTiles) + 1024;
  static_assert(kSharedBytes <= 227 * 1024, "beyond Hopper's shared memory per block");
};

#ifdef FLCE_SM90A
// Adds a row's sum into partial k (its m and the other fields written by the
// tile holding the partial's first column, `owner`); an ignored row's
// neutral sum of 1 comes from the owner alone.
__device__ __forceinline__ void AddToPartial(const KernelArgs& a, int64_t k, float sum, bool valid,
                                             bool owner, float reference) {
  if (valid || owner) atomicAdd(&a.stats.sum_exp[k], valid ? sum : 1.0f);
  if (owner) {
    a.stats.max[k] = valid ? reference : 0.0f;
    a.stats.sez[k] = 0.0f;
    a.stats.sum_z[k] = 0.0f;
  }
}

// One 64-row half of a ping-pong tile: ReferenceEpilogue's work for kBN
// columns, its row sums added into the partials the columns fall in: `lo`
// from the tile's first column, `hi` from the first 256-column boundary
// inside the tile on (a multiple of 64 columns in).
template <int kBN, bool kStoreE>
__device__ __forceinline__ void PingPongEpilogueHalf(
    const float (&acc)[kBN / 2], int64_t row0, int32_t n_tile, int32_t box_row, int consumer,
    const int32_t (&y)[2], const float (&reference)[2], const KernelArgs& a,
    const CUtensorMap* e_map, uint16_t (&boxes)[kBN / kOutBox][kOutBox * kOutBox]) {
  constexpr int kGroups = kBN / 64;
  constexpr int32_t kPartial = kLogitsStatsTileCols;
  const int lane = threadIdx.x & 31;
  const int32_t first = n_tile * kBN;
  StoreTargetLogit(acc, row0, first + (lane & 3) * 2, y, a);
  const float ref_log2[2] = {y[0] >= 0 ? reference[0] * kLog2e : INFINITY,
                             y[1] >= 0 ? reference[1] * kLog2e : INFINITY};
  float g[kGroups][2] = {};
  uint32_t packed[16 * kGroups];
  ReferenceExp<kGroups, kGroups>(acc, ref_log2, g, packed);
  if constexpr (kStoreE) {
    StageAndStore<kGroups>(packed, boxes, e_map, consumer, first, box_row, a.padded_vocab);
  }
  const int32_t lo_partial = first / kPartial;
  const int32_t boundary = (lo_partial + 1) * kPartial - first;  // columns into the tile
  float lo[2] = {0.0f, 0.0f}, hi[2] = {0.0f, 0.0f};
#pragma unroll
  for (int x = 0; x < kGroups; ++x) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      if (x * 64 < boundary) {
        lo[r] += g[x][r];
      } else {
        hi[r] += g[x][r];
      }
    }
  }
  const bool has_hi = boundary < kBN && lo_partial + 1 < a.n_tiles;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t row = row0 + 8 * r;
    lo[r] = QuadSum(lo[r]);
    if (kGroups > 2) hi[r] = QuadSum(hi[r]);
    if (row < a.rows && (lane & 3) == 0) {
      const int64_t k = row * a.n_tiles + lo_partial;
      const bool valid = y[r] >= 0;
      AddToPartial(a, k, lo[r], valid, first % kPartial == 0, reference[r]);
      if (has_hi) AddToPartial(a, k + 1, hi[r], valid, true, reference[r]);
    }
  }
}

template <int kBN>
__device__ __forceinline__ void IssueTileMmas(float (&acc)[2][kBN / 2], uint64_t a0, uint64_t a1,
                                              uint64_t b0) {
#pragma unroll
  for (int k = 0; k < kBK / 16; ++k) {
    const uint64_t db = DescAdvance(b0, k * 32);
    if constexpr (kBN == 128) {
      Wgmma<false, false, false>(acc[0], DescAdvance(a0, k * 32), db);
      Wgmma<false, false, false>(acc[1], DescAdvance(a1, k * 32), db);
    } else {
      WgmmaBf16N192(acc[0], DescAdvance(a0, k * 32), db);
      WgmmaBf16N192(acc[1], DescAdvance(a1, k * 32), db);
    }
  }
}
#endif  // FLCE_SM90A

template <int kBN, int kPair, bool kStoreE>
__global__ void __launch_bounds__(kThreads, 1)
    PingPongReferenceKernel(const __grid_constant__ CUtensorMap x_map,
                            const __grid_constant__ CUtensorMap w_map,
                            const __grid_constant__ CUtensorMap e_map, const KernelArgs a) {
#ifdef FLCE_SM90A
  using P = PingPong<kBN>;
  constexpr int kStages = P::kStages;
  extern __shared__ uint8_t raw_shared[];
  auto& sm = AlignedShared<typename P::SharedTiles>(raw_shared);
  const int wg = threadIdx.x / 128;
  const int t = threadIdx.x % 128;
  const int32_t k_blocks = (a.hidden + kBK - 1) / kBK;
  const int32_t n_tiles = (a.padded_vocab + kBN - 1) / kBN;
  const CtaTiles<kPair> tiles(a, n_tiles);
  if (threadIdx.x == 0) {
    for (int c = 0; c < kConsumers; ++c) MbarInit(&sm.issued[c], 128);
  }
  // A stage is consumed by one warpgroup in each CTA of the pair.
  InitStageBarriers(sm.full, sm.empty, kPair);
  if constexpr (kPair > 1) ClusterSync();  // the peer's barriers before its loads and releases

  if (wg == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(P::kProducerRegisters));
    if (t != 0) return;
    LoadTiles<kBN, kStages, kPair>(sm, &x_map, &w_map, a, n_tiles, k_blocks);
    return;
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(P::kConsumerRegisters));
  const int c = wg - 1;
  const int warp = t / 32;
  const int lane = t % 32;
  // Warpgroup c takes the CTA's tiles c, c + 2, ...; the ring carries every
  // tile's k-blocks in the CTA's order.
  StageCursor<kStages> at;
  if (c == 1) at.Skip(k_blocks);
  float acc[2][P::kFloats];  // acc[h]: rows h * 64 .. h * 64 + 63 of the tile
  int32_t turn = 0;
  for (int32_t index = tiles.unit + c * tiles.units; index < tiles.count;
       index += kConsumers * tiles.units, ++turn) {
    const TileAt at_tile = tiles.At(index);
    const int64_t row0 = static_cast<int64_t>(at_tile.m) * kBM + warp * 16 + lane / 4;
    int32_t y[2][2];
    float reference[2][2];
#pragma unroll
    for (int h = 0; h < 2; ++h) LoadRowInputs<true>(a, row0 + h * 64, y[h], reference[h]);
    // Warpgroup 0's tile j follows warpgroup 1's tile j - 1 on the tensor
    // cores, warpgroup 1's tile j follows warpgroup 0's tile j.
    if (c == 0 && turn > 0) MbarWait(&sm.issued[1], (turn - 1) & 1);
    if (c == 1) MbarWait(&sm.issued[0], turn & 1);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int i = 0; i < P::kFloats; ++i) acc[h][i] = 0.0f;
    }
    ConsumeStagesReleasing(
        at, sm.full, k_blocks, t == 0,
        [&](int stage) {
          IssueTileMmas<kBN>(acc, SmemDescK(&sm.a[stage][0]), SmemDescK(&sm.a[stage][64 * kBK]),
                             SmemDescK(&sm.b[stage][0]));
        },
        [&] { MbarArrive(&sm.issued[c]); },
        [&](int stage) {
          MbarArrive(&sm.empty[stage]);
          if constexpr (kPair > 1) MbarArriveInCta(&sm.empty[stage], tiles.rank ^ 1u);
        });
    at.Skip(k_blocks);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int i = 0; i < P::kFloats; ++i) KeepInRegisters(acc[h][i]);
    }
    const int32_t col0 = at_tile.n * kBN + (lane & 3) * 2;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if (col0 + kBN - 2 >= a.vocab) MaskColumns(acc[h], a.vocab - col0);
      PingPongEpilogueHalf<kBN, kStoreE>(acc[h], row0 + h * 64, at_tile.n, at_tile.m * kBM + h * 64, c, y[h],
                                reference[h], a, &e_map, sm.out[c]);
    }
  }
  // e must be in global memory before the kernel ends.
  if (t == 0) TmaStoreWaitAll();
#else
  __trap();  // built without sm_90a code: HeadFitsHopperKernels() is false there
#endif
}

template <int kBN, int kPair, bool kStoreE = true>
absl::Status Launch(const LogitsStatsArgs& args, const CUtensorMap& x_map, const CUtensorMap& e_map,
                    const KernelArgs& k, cudaStream_t stream, DeviceHealth* health) {
  constexpr size_t kSharedBytes = PingPong<kBN>::kSharedBytes;
  CUtensorMap w_map;
  FLCE_RETURN_IF_ERROR(
      Encode(&w_map, DType::kBF16, args.w, args.padded_vocab, args.hidden, kBN / kPair));
  // Every tile adds into its partials.
  const size_t sums = static_cast<size_t>(k.rows) * static_cast<size_t>(k.n_tiles);
  FLCE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(args.stats.sum_exp, 0, sums * sizeof(float), stream),
                            health);
  constexpr auto kernel = PingPongReferenceKernel<kBN, kPair, kStoreE>;
  FLCE_CUDA_RETURN_IF_ERROR(AllowDynamicShared<kernel>(kSharedBytes), health);
  // Units: single tiles, or pairs of token tiles each taken by a cluster.
  const int64_t units =
      (static_cast<int64_t>(k.m_tiles) + kPair - 1) / kPair * ((k.padded_vocab + kBN - 1) / kBN);
  PersistentLaunch launch(units, kPair, kThreads, kSharedBytes, stream);
  FLCE_CUDA_RETURN_IF_ERROR(cudaLaunchKernelEx(launch.config(), kernel, x_map, w_map, e_map, k),
                            health);
  return absl::OkStatus();
}

}  // namespace

static_assert(kBM == kOwnTileRows, "kernel_choices.h's thresholds count these token tiles");

absl::Status LaunchPingPong(const LogitsStatsArgs& args, const CUtensorMap& x_map,
                            const CUtensorMap& e_map, const KernelArgs& k, int tile_cols,
                            cudaStream_t stream, DeviceHealth* health) {
  if (tile_cols == 192) {
    const bool pairs = args.pingpong_pairs;
    if (!args.store_e) {
      return pairs ? Launch<192, 2, false>(args, x_map, e_map, k, stream, health)
                   : Launch<192, 1, false>(args, x_map, e_map, k, stream, health);
    }
    return pairs ? Launch<192, 2>(args, x_map, e_map, k, stream, health)
                 : Launch<192, 1>(args, x_map, e_map, k, stream, health);
  }
  return Launch<128, 1>(args, x_map, e_map, k, stream, health);
}

}  // namespace flce::cuda::logits_stats
