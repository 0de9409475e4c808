// The ping-pong grad_W kernel (grad_weight_pingpong.cuh) and its launch.
#include <cuda.h>

#include <algorithm>

#include "core/status_macros.h"
#include "kernels/cuda/base/sm90_support.h"
#include "kernels/cuda/ops/sm90/backward_gemm_tile.cuh"
#include "kernels/cuda/ops/sm90/grad_weight_pingpong.cuh"
#include "kernels/cuda/ops/sm90/sm90_primitives.cuh"

namespace flce::cuda {
namespace {

using namespace sm90;           // NOLINT: the kernel is written in these primitives
using namespace backward_tile;  // NOLINT: and this geometry

// A tile: 192 vocabulary rows x 128 hidden columns of grad_W, three m64n128
// fragments (192 fp32 accumulators per thread). 192 x 128 moves as many
// bytes from L2 per flop as the logits kernel's 128 x 192 tiles, 11% more
// than the cooperative 128 x 256, and two of them fit the registers where
// two 128 x 256 do not. Hidden sizes are multiples of 128 far more often
// than of 192, so the 192 lies along the vocabulary, where the last tile's
// rows past it are zero-filled on load and dropped on store.
constexpr int kTileRows = 192;
constexpr int kTileCols = 128;
constexpr int kFragments = kTileRows / 64;
constexpr int kStages = 4;
constexpr uint32_t kStageBytes = (kTileRows + kTileCols) * kBK * 2;  // 40 KiB
constexpr int kConsumers = 2;
constexpr int kThreads = 128 * (kConsumers + 1);
// fp32 results leave in boxes of 64 rows x kOutCols, three staging slots
// per warpgroup, 12 boxes per tile.
constexpr int kOutSlots = 3;
// 192 accumulators and the descriptors fit 232 registers per consumer
// thread; the producer's loop 40. 40 x 128 + 232 x 256 = 64512 of 65536.
constexpr int kProducerRegisters = 40;
constexpr int kConsumerRegisters = 232;

struct alignas(1024) SharedTiles {
  uint16_t a[kStages][kTileRows * kBK];
  uint16_t b[kStages][kTileCols * kBK];
  float out[kConsumers][kOutSlots][64 * kOutCols];
  uint64_t full[kStages];
  uint64_t empty[kStages];
  // A warpgroup has issued every MMA of its current tile: the other's turn.
  uint64_t issued[kConsumers];
  // The producer hands warpgroup c each of its tiles in slot c (-1: no more).
  uint64_t tile_full[kConsumers];
  uint64_t tile_empty[kConsumers];
  int32_t tile_index[kConsumers];
};
constexpr size_t kSharedBytes = sizeof(SharedTiles) + 1024;  // + runtime 1 KiB alignment
static_assert(kSharedBytes <= 227 * 1024, "beyond Hopper's shared memory per block");

struct KernelArgs {
  int32_t m_tiles;   // along the vocabulary
  int32_t n_tiles;   // along the hidden size
  int32_t k_blocks;  // 64 tokens each
  // Zero at launch: CTAs take tiles as they ask (atomicAdd). Null: CTA b
  // takes tiles b, b + gridDim.x, ...
  int32_t* tile_counter;
};

// Hidden tiles fastest: the CTAs in flight share D's columns (the tile's
// vocabulary rows) in L2, and X is read whole by every row of tiles. In CTA
// pairs (kPair = 2, a cluster of two) a unit is two adjacent hidden tiles of
// one vocabulary tile, the CTA of rank r taking hidden tile 2 n + r (past
// the last for an odd count: zero-filled loads, dropped adds), and each CTA
// loads part of the shared D^T tile into both by TMA multicast: 30% fewer
// bytes from L2 per flop.
struct Tile {
  int32_t m, n;
};
template <int kPair>
__device__ __forceinline__ int32_t UnitsPerRow(const KernelArgs& a) {
  return (a.n_tiles + kPair - 1) / kPair;
}
template <int kPair>
__device__ __forceinline__ Tile TileAt(int32_t index, const KernelArgs& a, uint32_t rank) {
  const int32_t per_row = UnitsPerRow<kPair>(a);
  return Tile{index / per_row, (index % per_row) * kPair + static_cast<int32_t>(rank)};
}

#ifdef FLCE_SM90A
// The CTA's unit for its `turn`-th turn (turns alternate between the
// consumer warpgroups).
template <int kPair>
__device__ __forceinline__ int32_t NextTile(const KernelArgs& a, int32_t turn) {
  if (kPair == 1 && a.tile_counter != nullptr) return atomicAdd(a.tile_counter, 1);
  return static_cast<int32_t>(blockIdx.x / kPair +
                              static_cast<int64_t>(turn) * (gridDim.x / kPair));
}

// Gives turn `turn`'s tile (-1: none) to the warpgroup whose turn it is,
// once that warpgroup has read the tile of its previous turn.
__device__ __forceinline__ void HandOut(SharedTiles& sm, int32_t turn, int32_t index) {
  const int c = turn % kConsumers;
  MbarWait(&sm.tile_empty[c], ((turn / kConsumers) & 1) ^ 1);
  sm.tile_index[c] = index;
  MbarArrive(&sm.tile_full[c]);
}

// One thread of the producer warpgroup: the CTA's tiles in turn, each handed
// to its consumer and its k-blocks put into the ring; after the last, both
// consumers are told there is no more. In a pair, the CTA of rank 0 loads
// the D^T tile's first two 64-row boxes into both CTAs, rank 1 the third,
// and the producer waits for the last releases before its CTA may exit.
template <int kPair>
__device__ __forceinline__ void LoadTiles(SharedTiles& sm, const CUtensorMap* a_map,
                                          const CUtensorMap* b_map, const CUtensorMap* out_map,
                                          const KernelArgs& a, uint32_t rank) {
  const int32_t num_units = a.m_tiles * UnitsPerRow<kPair>(a);
  StageCursor<kStages> at;
  for (int32_t turn = 0;; ++turn) {
    const int32_t index = NextTile<kPair>(a, turn);
    if (index >= num_units) {
      HandOut(sm, turn, -1);
      HandOut(sm, turn + 1, -1);
      if constexpr (kPair > 1) DrainStages(at, sm.empty);
      return;
    }
    HandOut(sm, turn, index);
    const Tile tile = TileAt<kPair>(index, a, rank);
    PrefetchOutTile<kTileRows, kTileCols>(out_map, tile.n * kTileCols, tile.m * kTileRows);
    for (int32_t kb = 0; kb < a.k_blocks; ++kb) {
      uint64_t* full = &sm.full[at.stage];
      MbarWait(&sm.empty[at.stage], at.phase ^ 1);
      MbarExpectTx(full, kStageBytes);
      for (int f = 0; f < kFragments; ++f) {
        if constexpr (kPair == 1) {
          TmaLoad(&sm.a[at.stage][f * kBox * kBK], a_map, full, tile.m * kTileRows + f * kBox,
                  kb * kBK);
        } else if ((f < 2) == (rank == 0)) {
          TmaLoadMulticast(&sm.a[at.stage][f * kBox * kBK], a_map, full,
                           tile.m * kTileRows + f * kBox, kb * kBK, 0x3);
        }
      }
      for (int x = 0; x < kTileCols / kBox; ++x) {
        TmaLoad(&sm.b[at.stage][x * kBox * kBK], b_map, full, tile.n * kTileCols + x * kBox,
                kb * kBK);
      }
      at.Next();
    }
  }
}

// A consumer's tile out through its staging slots, each 64 x 32 box
// reduce-added onto grad_W by the copy engine.
__device__ __forceinline__ void ReduceAddTile(const float (&acc)[kFragments][64], int consumer,
                                              int col0, int row0, const CUtensorMap* out_map,
                                              float (&slots)[kOutSlots][64 * kOutCols]) {
  StoreFragments(acc, consumer, slots, [&](const float* box, int b) {
    TmaReduceAdd(out_map, box, col0 + (b % 4) * kOutCols, row0 + (b / 4) * 64);
  });
}
#endif  // FLCE_SM90A

// gw (cols x hidden, fp32) += D^T . X: A = D^T (the vocabulary x tokens,
// MN-major in D's rows x cols layout), B = X (tokens x hidden, MN-major),
// K = the chunk's tokens. Each consumer warpgroup owns whole tiles, the two
// taking the tensor cores in turns: a warpgroup issues its tile's MMAs once
// the other has issued all of its previous tile's, then reduce-adds its
// results while the other's MMAs run, so the tensor cores do not idle
// through the epilogue. Every grad_W element gets one fp32 add per launch.
template <bool kHalf, int kPair>
__global__ void __launch_bounds__(kThreads, 1)
    GradWeightPingPongKernel(const __grid_constant__ CUtensorMap a_map,
                             const __grid_constant__ CUtensorMap b_map,
                             const __grid_constant__ CUtensorMap out_map, const KernelArgs a) {
#ifdef FLCE_SM90A
  extern __shared__ uint8_t raw_shared[];
  SharedTiles& sm = AlignedShared<SharedTiles>(raw_shared);
  const int wg = threadIdx.x / 128;
  const int t = threadIdx.x % 128;
  if (threadIdx.x == 0) {
    for (int c = 0; c < kConsumers; ++c) {
      MbarInit(&sm.issued[c], 128);
      MbarInit(&sm.tile_full[c], 1);
      MbarInit(&sm.tile_empty[c], 128);
    }
  }
  // A stage is consumed by one warpgroup in each CTA of the pair.
  InitStageBarriers(sm.full, sm.empty, kPair);
  const uint32_t rank = kPair > 1 ? ClusterCtaRank() : 0;
  if constexpr (kPair > 1) ClusterSync();  // the peer's barriers before its loads and releases

  if (wg == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kProducerRegisters));
    if (t == 0) {
      LoadTiles<kPair>(sm, &a_map, &b_map, &out_map, a, rank);
      // Launched beside the grad_input GEMM (programmatic dependent launch):
      // this grid does not complete before that one, so the stream's next
      // work may rely on both.
      WaitForPrerequisiteGrids();
    }
    return;
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kConsumerRegisters));
  const int c = wg - 1;
  // Warpgroup c takes the CTA's turns c, c + 2, ...; the ring carries every
  // tile's k-blocks in the CTA's order.
  StageCursor<kStages> at;
  if (c == 1) at.Skip(a.k_blocks);
  float acc[kFragments][64];         // acc[f]: vocabulary rows f * 64 .. f * 64 + 63 of the tile
  for (int32_t turn = 0;; ++turn) {  // this warpgroup's turns
    MbarWait(&sm.tile_full[c], turn & 1);
    const int32_t index = sm.tile_index[c];
    MbarArrive(&sm.tile_empty[c]);
    if (index < 0) break;
    const Tile tile = TileAt<kPair>(index, a, rank);
    // Warpgroup 0's tile j follows warpgroup 1's tile j - 1 on the tensor
    // cores, warpgroup 1's tile j follows warpgroup 0's tile j.
    if (c == 0 && turn > 0) MbarWait(&sm.issued[1], (turn - 1) & 1);
    if (c == 1) MbarWait(&sm.issued[0], turn & 1);
#pragma unroll
    for (int f = 0; f < kFragments; ++f) {
#pragma unroll
      for (int i = 0; i < 64; ++i) acc[f][i] = 0.0f;
    }
    ConsumeStagesReleasing(
        at, sm.full, a.k_blocks, t == 0,
        [&](int stage) {
          // k advances 16 rows of 128 bytes in both MN-major operands.
          const uint64_t b0 = SmemDescMN(&sm.b[stage][0], kBoxBytes);
          uint64_t a0[kFragments];
#pragma unroll
          for (int f = 0; f < kFragments; ++f) {
            a0[f] = SmemDescMN(&sm.a[stage][f * kBox * kBK], kBoxBytes);
          }
#pragma unroll
          for (int k = 0; k < kBK / 16; ++k) {
            const uint32_t step = k * 16 * kBox * 2;
#pragma unroll
            for (int f = 0; f < kFragments; ++f) {
              Wgmma<kHalf, true, true>(acc[f], DescAdvance(a0[f], step), DescAdvance(b0, step));
            }
          }
        },
        [&] { MbarArrive(&sm.issued[c]); },
        [&](int stage) {
          MbarArrive(&sm.empty[stage]);
          if constexpr (kPair > 1) MbarArriveInCta(&sm.empty[stage], rank ^ 1u);
        });
    at.Skip(a.k_blocks);
#pragma unroll
    for (int f = 0; f < kFragments; ++f) {
#pragma unroll
      for (int i = 0; i < 64; ++i) KeepInRegisters(acc[f][i]);
    }
    ReduceAddTile(acc, c, tile.n * kTileCols, tile.m * kTileRows, &out_map, sm.out[c]);
  }
  // The sums must be in global memory before the kernel ends.
  if (t == 0) TmaStoreWaitAll();
#else
  __trap();  // built without sm_90a code: BackwardGemmSupported() is false there
#endif
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// `beside_previous`: a programmatic dependent of the kernel before it on the
// stream, whose CTAs let it start (LetDependentGridStart).
template <bool kHalf, int kPair>
absl::Status Launch(const CUtensorMap& a_map, const CUtensorMap& b_map, const CUtensorMap& out_map,
                    const KernelArgs& k, bool beside_previous, cudaStream_t stream,
                    DeviceHealth* health) {
  constexpr auto kernel = GradWeightPingPongKernel<kHalf, kPair>;
  FLCE_CUDA_RETURN_IF_ERROR(AllowDynamicShared<kernel>(kSharedBytes), health);
  const int64_t units = static_cast<int64_t>(k.m_tiles) * CeilDiv(k.n_tiles, kPair);
  PersistentLaunch launch(units, kPair, kThreads, kSharedBytes, stream);
  if (beside_previous) launch.StartBesidePrevious();
  FLCE_CUDA_RETURN_IF_ERROR(cudaLaunchKernelEx(launch.config(), kernel, a_map, b_map, out_map, k),
                            health);
  return absl::OkStatus();
}

}  // namespace

absl::Status LaunchGradWeightPingPong(DType dtype, const GradWeightGemmArgs& args,
                                      cudaStream_t stream, DeviceHealth* health) {
  CUtensorMap a_map, b_map, out_map;
  FLCE_RETURN_IF_ERROR(EncodeMatrix(&a_map, dtype, args.d, args.rows, args.cols, kBox, kBK));
  FLCE_RETURN_IF_ERROR(EncodeMatrix(&b_map, dtype, args.x, args.rows, args.hidden, kBox, kBK));
  FLCE_RETURN_IF_ERROR(
      EncodeMatrix(&out_map, DType::kF32, args.gw, args.cols, args.hidden, kOutCols, 64));
  KernelArgs k;
  k.m_tiles = static_cast<int32_t>(CeilDiv(args.cols, kTileRows));
  k.n_tiles = static_cast<int32_t>(CeilDiv(args.hidden, kTileCols));
  k.k_blocks = static_cast<int32_t>(CeilDiv(args.rows, kBK));
  k.tile_counter = args.tile_counter;
  const bool beside = args.beside_grad_input;
  // A single hidden tile would leave every pair's second CTA without work.
  if (args.cta_pairs && k.n_tiles >= 2) {
    return dtype == DType::kF16
               ? Launch<true, 2>(a_map, b_map, out_map, k, beside, stream, health)
               : Launch<false, 2>(a_map, b_map, out_map, k, beside, stream, health);
  }
  return dtype == DType::kF16 ? Launch<true, 1>(a_map, b_map, out_map, k, beside, stream, health)
                              : Launch<false, 1>(a_map, b_map, out_map, k, beside, stream, health);
}

}  // namespace flce::cuda
