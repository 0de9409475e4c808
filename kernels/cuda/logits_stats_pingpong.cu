// The ping-pong logits-stats kernel (logits_stats_tile.cuh) and its launch.
#include <cuda.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "kernels/cuda/logits_stats_gemm.cuh"
#include "kernels/cuda/logits_stats_tile.cuh"
#include "kernels/cuda/sm90_primitives.cuh"
#include "kernels/cuda/sm90_support.h"
#include "kernels/status_macros.h"

namespace flce::cuda::logits_stats {
namespace {

using namespace sm90;  // NOLINT: the kernel is written in these primitives

// The ping-pong kernel, for the default call (row-scaled e around the row
// reference, neither entropy nor accuracy): 128 tokens x 128 vocabulary
// columns per tile, each consumer warpgroup owning whole tiles, the two
// taking the tensor cores in turns. A warpgroup issues its tile's MMAs once
// the other has issued all of its previous tile's, then runs its epilogue
// while the other's MMAs run: the tensor cores do not idle through
// epilogues, which at H = 1024 take a fifth of the cooperative kernel's time.
// Six stages of 32 KiB, each consumed by one warpgroup. The partials keep
// the cooperative kernel's 256-column layout: both 128-column halves of a
// partial add their row sums into it (zeroed before the launch). Two adds
// onto zero give a + b whichever lands first, so the result is repeatable.
constexpr int kBN = 128;
constexpr int kStages = 6;
static_assert(kLogitsStatsTileCols == 2 * kBN, "two ping-pong tiles make one partial");

struct alignas(1024) SharedTiles {
  uint16_t a[kStages][kBM * kBK];
  uint16_t b[kStages][kBN * kBK];
  uint16_t out[kConsumers][kOutBoxes][kOutBox * kOutBox];
  uint64_t full[kStages];
  uint64_t empty[kStages];
  // A warpgroup has issued every MMA of its current tile: the other's turn.
  uint64_t issued[kConsumers];
};
constexpr size_t kSharedBytes = sizeof(SharedTiles) + 1024;
static_assert(kSharedBytes <= 227 * 1024, "beyond Hopper's shared memory per block");
static_assert(kBN == kOutBoxes * kOutBox, "a row half's two boxes span a tile");

#ifdef FLCE_SM90A
// Moves a ring cursor past `blocks` stages: the other warpgroup's tile.
__device__ __forceinline__ void SkipStages(StageCursor<kStages>& at, int32_t blocks) {
  const int32_t next = at.stage + blocks;
  at.phase ^= static_cast<uint32_t>(next / kStages) & 1u;
  at.stage = next % kStages;
}

// One 64-row half of a ping-pong tile: ReferenceEpilogue's work for 128
// columns, its row sums added into the 256-column partial (n_tile / 2). The
// even half also writes the partial's reference fields; an ignored row's
// neutral sum of 1 comes from the even half alone.
__device__ __forceinline__ void PingPongEpilogueHalf(
    const float (&acc)[64], int64_t row0, int32_t n_tile, int32_t box_row, int consumer,
    const int32_t (&y)[2], const float (&reference)[2], const KernelArgs& a,
    const CUtensorMap* e_map, uint16_t (&boxes)[kOutBoxes][kOutBox * kOutBox]) {
  const int lane = threadIdx.x & 31;
  const int32_t col0 = n_tile * kBN + (lane & 3) * 2;
  StoreTargetLogit<1>(*reinterpret_cast<const float(*)[1][64]>(&acc), row0, col0, y, a);
  const float ref_log2[2] = {y[0] >= 0 ? reference[0] * kLog2e : INFINITY,
                             y[1] >= 0 ? reference[1] * kLog2e : INFINITY};
  float s[2] = {0.0f, 0.0f};
  uint32_t packed[32];
  ReferenceExpHalf(acc, ref_log2, s, packed);
  StageAndStore(packed, boxes, e_map, consumer, n_tile * kBN, box_row);
  const bool even = (n_tile & 1) == 0;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t row = row0 + 8 * r;
#pragma unroll
    for (int off = 1; off <= 2; off <<= 1) s[r] += __shfl_xor_sync(0xffffffffu, s[r], off);
    if (row < a.rows && (lane & 3) == 0) {
      const int64_t k = row * a.n_tiles + n_tile / 2;
      const bool valid = y[r] >= 0;
      if (valid || even) atomicAdd(&a.stats.sum_exp[k], valid ? s[r] : 1.0f);
      if (even) {
        a.stats.max[k] = valid ? reference[r] : 0.0f;
        a.stats.sez[k] = 0.0f;
        a.stats.sum_z[k] = 0.0f;
      }
    }
  }
}
#endif  // FLCE_SM90A

__global__ void __launch_bounds__(kThreads, 1)
    PingPongReferenceKernel(const __grid_constant__ CUtensorMap x_map,
                            const __grid_constant__ CUtensorMap w_map,
                            const __grid_constant__ CUtensorMap e_map, const KernelArgs a) {
#ifdef FLCE_SM90A
  extern __shared__ uint8_t raw_shared[];
  SharedTiles& sm = AlignedShared<SharedTiles>(raw_shared);
  const int wg = threadIdx.x / 128;
  const int t = threadIdx.x % 128;
  const int32_t k_blocks = (a.hidden + kBK - 1) / kBK;
  const int32_t n_tiles = a.padded_vocab / kBN;
  const int32_t num_tiles = a.m_tiles * n_tiles;
  if (threadIdx.x == 0) {
    for (int c = 0; c < kConsumers; ++c) MbarInit(&sm.issued[c], 128);
  }
  InitStageBarriers(sm.full, sm.empty, 1);

  if (wg == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
    if (t != 0) return;
    LoadTiles<kBN, kStages>(sm, &x_map, &w_map, a, n_tiles, k_blocks);
    return;
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
  const int c = wg - 1;
  const int warp = t / 32;
  const int lane = t % 32;
  // Warpgroup c takes the CTA's tiles c, c + 2, ...; the ring carries every
  // tile's k-blocks in the CTA's order.
  StageCursor<kStages> at;
  if (c == 1) SkipStages(at, k_blocks);
  float acc[2][64];  // acc[h]: rows h * 64 .. h * 64 + 63 of the tile
  int32_t turn = 0;
  for (int32_t tile = blockIdx.x + c * gridDim.x; tile < num_tiles;
       tile += kConsumers * gridDim.x, ++turn) {
    const TileAt at_tile(tile, a, n_tiles);
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
      for (int i = 0; i < 64; ++i) acc[h][i] = 0.0f;
    }
    ConsumeStages(
        at, sm.full, sm.empty, k_blocks, t == 0,
        [&](int stage) {
          const uint64_t a0 = SmemDescK(&sm.a[stage][0]);
          const uint64_t a1 = SmemDescK(&sm.a[stage][64 * kBK]);
          const uint64_t b0 = SmemDescK(&sm.b[stage][0]);
#pragma unroll
          for (int k = 0; k < kBK / 16; ++k) {
            const uint64_t db = DescAdvance(b0, k * 32);
            Wgmma<false, false, false>(acc[0], DescAdvance(a0, k * 32), db);
            Wgmma<false, false, false>(acc[1], DescAdvance(a1, k * 32), db);
          }
        },
        [&] { MbarArrive(&sm.issued[c]); });
    SkipStages(at, k_blocks);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int i = 0; i < 64; ++i) KeepInRegisters(acc[h][i]);
    }
    const int32_t col0 = at_tile.n * kBN + (lane & 3) * 2;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if (col0 + kBN - 2 >= a.vocab) MaskColumns(acc[h], a.vocab - col0);
      PingPongEpilogueHalf(acc[h], row0 + h * 64, at_tile.n, at_tile.m * kBM + h * 64, c, y[h],
                           reference[h], a, &e_map, sm.out[c]);
    }
  }
  // e must be in global memory before the kernel ends.
  if (t == 0) TmaStoreWaitAll();
#else
  __trap();  // built without sm_90a code: LogitsStatsSupported() is false there
#endif
}

}  // namespace

// Measured on the H200 (docs/perf/cuda.md step 34): -3 ms at H = 1024, about
// -1 ms at 1536, +1.5 ms at 2048 and +1.4 to +8 ms at 4096 in whole runs.
// Chunks of less than one token tile only stream W: the cooperative kernel
// took 8-12 us less per call at 1, 8, 64 and 65 tokens, the ping-pong kernel
// 9-12 us less at 96 and 128 (step 39); the crossover lies in between.
bool PingPongServes(int64_t hidden, int64_t rows) {
  const char* env = std::getenv("FLCE_CUDA_STATS_KERNEL");
  if (env != nullptr && std::string(env) == "cooperative") return false;
  if (env != nullptr && std::string(env) == "pingpong") return true;
  return hidden <= 1536 && rows >= 3 * kBM / 4;
}

absl::Status LaunchPingPong(const LogitsStatsArgs& args, const CUtensorMap& x_map,
                            const CUtensorMap& e_map, const KernelArgs& k, cudaStream_t stream,
                            DeviceHealth* health) {
  CUtensorMap w_map;
  FLCE_RETURN_IF_ERROR(Encode(&w_map, DType::kBF16, args.w, args.padded_vocab, args.hidden, kBN));
  // Both halves of a partial add into it.
  const size_t sums = static_cast<size_t>(k.rows) * static_cast<size_t>(k.n_tiles);
  FLCE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(args.stats.sum_exp, 0, sums * sizeof(float), stream),
                            health);
  FLCE_CUDA_RETURN_IF_ERROR(AllowDynamicShared<PingPongReferenceKernel>(kSharedBytes), health);
  const int64_t tiles = static_cast<int64_t>(k.m_tiles) * (k.padded_vocab / kBN);
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(tiles, std::max(SmCount(), 1)));
  PingPongReferenceKernel<<<grid, kThreads, kSharedBytes, stream>>>(x_map, w_map, e_map, k);
  FLCE_CUDA_RETURN_IF_ERROR(cudaGetLastError(), health);
  return absl::OkStatus();
}

}  // namespace flce::cuda::logits_stats
