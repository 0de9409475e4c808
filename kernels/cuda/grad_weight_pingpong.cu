// The ping-pong grad_W kernel (grad_weight_pingpong.cuh) and its launch.
#include <cuda.h>

#include <algorithm>

#include "kernels/cuda/backward_gemm_tile.cuh"
#include "kernels/cuda/grad_weight_pingpong.cuh"
#include "kernels/cuda/sm90_primitives.cuh"
#include "kernels/cuda/sm90_support.h"
#include "kernels/status_macros.h"

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
};
constexpr size_t kSharedBytes = sizeof(SharedTiles) + 1024;  // + runtime 1 KiB alignment
static_assert(kSharedBytes <= 227 * 1024, "beyond Hopper's shared memory per block");

struct KernelArgs {
  int32_t m_tiles;   // along the vocabulary
  int32_t n_tiles;   // along the hidden size
  int32_t k_blocks;  // 64 tokens each
};

// Hidden tiles fastest: the CTAs in flight share D's columns (the tile's
// vocabulary rows) in L2, and X is read whole by every row of tiles.
struct Tile {
  int32_t m, n;
};
__device__ __forceinline__ Tile TileAt(int32_t index, const KernelArgs& a) {
  return Tile{index / a.n_tiles, index % a.n_tiles};
}

#ifdef FLCE_SM90A
// One thread of the producer warpgroup: every tile of the CTA in order, its
// k-blocks into the ring (the two consumers take alternate tiles).
__device__ __forceinline__ void LoadTiles(SharedTiles& sm, const CUtensorMap* a_map,
                                          const CUtensorMap* b_map, const CUtensorMap* out_map,
                                          const KernelArgs& a) {
  const int32_t num_tiles = a.m_tiles * a.n_tiles;
  StageCursor<kStages> at;
  for (int32_t index = blockIdx.x; index < num_tiles; index += gridDim.x) {
    const Tile tile = TileAt(index, a);
    PrefetchOutTile<kTileRows, kTileCols>(out_map, tile.n * kTileCols, tile.m * kTileRows);
    for (int32_t kb = 0; kb < a.k_blocks; ++kb) {
      uint64_t* full = &sm.full[at.stage];
      MbarWait(&sm.empty[at.stage], at.phase ^ 1);
      MbarExpectTx(full, kStageBytes);
      for (int f = 0; f < kFragments; ++f) {
        TmaLoad(&sm.a[at.stage][f * kBox * kBK], a_map, full, tile.m * kTileRows + f * kBox,
                kb * kBK);
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
template <bool kHalf>
__global__ void __launch_bounds__(kThreads, 1)
    GradWeightPingPongKernel(const __grid_constant__ CUtensorMap a_map,
                             const __grid_constant__ CUtensorMap b_map,
                             const __grid_constant__ CUtensorMap out_map, const KernelArgs a) {
#ifdef FLCE_SM90A
  extern __shared__ uint8_t raw_shared[];
  SharedTiles& sm = AlignedShared<SharedTiles>(raw_shared);
  const int wg = threadIdx.x / 128;
  const int t = threadIdx.x % 128;
  const int32_t num_tiles = a.m_tiles * a.n_tiles;
  if (threadIdx.x == 0) {
    for (int c = 0; c < kConsumers; ++c) MbarInit(&sm.issued[c], 128);
  }
  InitStageBarriers(sm.full, sm.empty, 1);

  if (wg == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kProducerRegisters));
    if (t == 0) LoadTiles(sm, &a_map, &b_map, &out_map, a);
    return;
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kConsumerRegisters));
  const int c = wg - 1;
  // Warpgroup c takes the CTA's tiles c, c + 2, ...; the ring carries every
  // tile's k-blocks in the CTA's order.
  StageCursor<kStages> at;
  if (c == 1) at.Skip(a.k_blocks);
  float acc[kFragments][64];  // acc[f]: vocabulary rows f * 64 .. f * 64 + 63 of the tile
  int32_t turn = 0;
  for (int32_t index = blockIdx.x + c * gridDim.x; index < num_tiles;
       index += kConsumers * gridDim.x, ++turn) {
    const Tile tile = TileAt(index, a);
    // Warpgroup 0's tile j follows warpgroup 1's tile j - 1 on the tensor
    // cores, warpgroup 1's tile j follows warpgroup 0's tile j.
    if (c == 0 && turn > 0) MbarWait(&sm.issued[1], (turn - 1) & 1);
    if (c == 1) MbarWait(&sm.issued[0], turn & 1);
#pragma unroll
    for (int f = 0; f < kFragments; ++f) {
#pragma unroll
      for (int i = 0; i < 64; ++i) acc[f][i] = 0.0f;
    }
    ConsumeStages(
        at, sm.full, sm.empty, a.k_blocks, t == 0,
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
        [&] { MbarArrive(&sm.issued[c]); });
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

template <bool kHalf>
absl::Status Launch(const CUtensorMap& a_map, const CUtensorMap& b_map, const CUtensorMap& out_map,
                    const KernelArgs& k, cudaStream_t stream, DeviceHealth* health) {
  FLCE_CUDA_RETURN_IF_ERROR(AllowDynamicShared<GradWeightPingPongKernel<kHalf>>(kSharedBytes),
                            health);
  const int64_t tiles = static_cast<int64_t>(k.m_tiles) * k.n_tiles;
  const int64_t ctas = std::min<int64_t>(tiles, std::max(SmCount(), 1));
  GradWeightPingPongKernel<kHalf>
      <<<static_cast<unsigned>(ctas), kThreads, kSharedBytes, stream>>>(a_map, b_map, out_map, k);
  FLCE_CUDA_RETURN_IF_ERROR(cudaGetLastError(), health);
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
  return dtype == DType::kF16 ? Launch<true>(a_map, b_map, out_map, k, stream, health)
                              : Launch<false>(a_map, b_map, out_map, k, stream, health);
}

}  // namespace flce::cuda
