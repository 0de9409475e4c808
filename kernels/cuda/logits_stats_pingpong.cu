#include <cuda.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>

#include "kernels/cuda/logits_stats_gemm.cuh"
#include "kernels/cuda/logits_stats_tile.cuh"
#include "kernels/status_macros.h"

namespace flce::cuda::logits_stats {
namespace {

// The ping-pong kernel: 128 tokens x 128 vocabulary columns per tile; the two
// consumer warpgroups take whole tiles in turns, one issuing its tile's MMAs
// while the other runs the previous tile's epilogue, so that the tensor
// cores do not idle during epilogues (at H = 1024 an epilogue takes about as
// long as a mainloop). Six stages of 32 KiB, each consumed by one warpgroup.
//
// kPair: CTAs run in clusters of two over the same token tile and adjacent
// W tiles; each loads its own W tile and one 64-row half of the hidden rows,
// which it multicasts to both. A pair so reads the hidden rows once per 256
// columns, as the cooperative kernel does, and a CTA pulls 24 KiB per stage
// from L2 instead of 32.
constexpr int kBN = 128;
constexpr int kStages = 6;
constexpr uint32_t kStageBytes = (kBM + kBN) * kBK * 2;
constexpr int kPairCtas = 2;
constexpr int kPairHalfRows = kBM / kPairCtas;

struct alignas(1024) SharedTiles {
  uint16_t a[kStages][kBM * kBK];
  uint16_t b[kStages][kBN * kBK];
  uint16_t out[kConsumers][kOutBoxes][kOutBox * kOutBox];
  uint64_t full[kStages];
  uint64_t empty[kStages];
  // A warpgroup has issued every MMA of its current tile: the other's turn.
  uint64_t issued[kConsumers];
};
constexpr size_t kSharedBytes = sizeof(SharedTiles) + 1024;  // + runtime 1 KiB alignment
static_assert(kSharedBytes <= 227 * 1024, "beyond Hopper's shared memory per block");
static_assert(kBN == kOutBoxes * kOutBox, "two boxes span a tile's columns");

// The tiles a CTA computes, in units of one token tile x kPairCtas (or one)
// adjacent W tiles, token tiles fastest (the CTAs in flight share a few W
// tiles, and the chunk's hidden rows stay in L2); a pair's CTAs take one unit
// together, each its own W tile of it. The consumer warpgroups take the CTA's
// units in turns.
struct TileWalk {
  int32_t m_tiles, units, first, step, rank, group;
  __device__ TileWalk(const KernelArgs& a, int group_ctas, uint32_t cta_rank)
      : m_tiles(a.m_tiles),
        units(a.m_tiles * ((a.n_tiles + group_ctas - 1) / group_ctas)),
        first(static_cast<int32_t>(blockIdx.x) / group_ctas),
        step(static_cast<int32_t>(gridDim.x) / group_ctas),
        rank(static_cast<int32_t>(cta_rank)),
        group(group_ctas) {}
  __device__ int32_t MTile(int32_t unit) const { return unit % m_tiles; }
  __device__ int32_t NTile(int32_t unit) const { return (unit / m_tiles) * group + rank; }
};

#ifdef FLCE_SM90A
// Moves a ring cursor past `blocks` stages: the other warpgroup's tile.
__device__ __forceinline__ void SkipStages(StageCursor<kStages>& at, int32_t blocks) {
  const int32_t next = at.stage + blocks;
  at.phase ^= static_cast<uint32_t>(next / kStages) & 1u;
  at.stage = next % kStages;
}
#endif  // FLCE_SM90A

template <bool kHalf, bool kSumZ, bool kRowRef, bool kPair>
__global__ void __launch_bounds__(kThreads, 1)
    PingPongKernel(const __grid_constant__ CUtensorMap x_map,
                   const __grid_constant__ CUtensorMap w_map,
                   const __grid_constant__ CUtensorMap e_map, const KernelArgs a) {
#ifdef FLCE_SM90A
  if (a.run_if != nullptr && *a.run_if == 0) return;
  extern __shared__ uint8_t raw_shared[];
  SharedTiles& sm = AlignedShared<SharedTiles>(raw_shared);
  const int wg = threadIdx.x / 128;
  const int t = threadIdx.x % 128;
  const int32_t k_blocks = (a.hidden + kBK - 1) / kBK;
  // A stage is consumed by one warpgroup; in a pair it is free once that
  // warpgroup of both CTAs has released it (either CTA's multicast writes it
  // in both).
  if (threadIdx.x == 0) {
    for (int c = 0; c < kConsumers; ++c) MbarInit(&sm.issued[c], 128);
  }
  InitStageBarriers(sm.full, sm.empty, kPair ? kPairCtas : 1);
  const uint32_t rank = kPair ? ClusterCtaRank() : 0;
  if (kPair) ClusterSync();
  const TileWalk walk(a, kPair ? kPairCtas : 1, rank);

  if (wg == 0) {
    // Producer: TMA loads run ahead of the consumers by up to kStages.
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
    if (t != 0) return;
    StageCursor<kStages> at;
    for (int32_t unit = walk.first; unit < walk.units; unit += walk.step) {
      const int32_t m_tile = walk.MTile(unit);
      const int32_t n_tile = walk.NTile(unit);
      for (int32_t kb = 0; kb < k_blocks; ++kb) {
        MbarWait(&sm.empty[at.stage], at.phase ^ 1);
        MbarExpectTx(&sm.full[at.stage], kStageBytes);
        if (kPair) {
          TmaLoadMulticast(&sm.a[at.stage][rank * kPairHalfRows * kBK], &x_map,
                           &sm.full[at.stage], kb * kBK, m_tile * kBM + rank * kPairHalfRows,
                           (1u << kPairCtas) - 1);
        } else {
          TmaLoad(sm.a[at.stage], &x_map, &sm.full[at.stage], kb * kBK, m_tile * kBM);
        }
        // A pair's odd last W tile lies past the padded vocabulary: TMA fills
        // it with zeros (counted in the bytes) and the epilogue writes none of it.
        TmaLoad(sm.b[at.stage], &w_map, &sm.full[at.stage], kb * kBK, n_tile * kBN);
        at.Next();
      }
    }
    if (kPair) DrainStages(at, sm.empty);
    return;
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
  const int c = wg - 1;
  const int warp = t / 32;
  const int lane = t % 32;
  // Warpgroup c takes the CTA's units c, c + 2, ...; the ring carries every
  // unit's k-blocks in walk order.
  StageCursor<kStages> at;
  if (c == 1) SkipStages(at, k_blocks);
  const auto release = [&](int stage) {
    MbarArrive(&sm.empty[stage]);
    if (kPair) MbarArriveInCta(&sm.empty[stage], rank ^ 1);
  };
  float acc[2][64];
  int32_t turn = 0;  // this warpgroup's tiles so far
  for (int32_t unit = walk.first + c * walk.step; unit < walk.units;
       unit += kConsumers * walk.step, ++turn) {
    const int32_t m_tile = walk.MTile(unit);
    const int32_t n_tile = walk.NTile(unit);
    // acc[h] holds rows h * 64 .. h * 64 + 63 of the tile.
    const int64_t row0 = static_cast<int64_t>(m_tile) * kBM + warp * 16 + lane / 4;
    int32_t y[2][2];
    float reference[2][2];
#pragma unroll
    for (int h = 0; h < 2; ++h) LoadRowInputs<kRowRef>(a, row0 + h * 64, y[h], reference[h]);
    // Warpgroup 0's tile n follows warpgroup 1's tile n - 1 on the tensor
    // cores, warpgroup 1's tile n follows warpgroup 0's tile n.
    if (c == 0 && turn > 0) MbarWait(&sm.issued[1], (turn - 1) & 1);
    if (c == 1) MbarWait(&sm.issued[0], turn & 1);
    if (kPair && n_tile >= a.n_tiles) {
      // A pair's W tile past the vocabulary: its hidden half still reaches
      // the peer, and the stages are released as they fill, with no MMAs.
      for (int32_t kb = 0; kb < k_blocks; ++kb) {
        MbarWait(&sm.full[at.stage], at.phase);
        if (t == 0) release(at.stage);
        at.Next();
      }
      MbarArrive(&sm.issued[c]);
      SkipStages(at, k_blocks);
      continue;
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int i = 0; i < 64; ++i) acc[h][i] = 0.0f;
    }
    int prev = -1;
    for (int32_t kb = 0; kb < k_blocks; ++kb) {
      MbarWait(&sm.full[at.stage], at.phase);
      WgmmaFence();
#pragma unroll
      for (int k = 0; k < kBK / 16; ++k) {
        const uint64_t db = SmemDescK(&sm.b[at.stage][k * 16]);
        Wgmma<kHalf, false, false>(acc[0], SmemDescK(&sm.a[at.stage][k * 16]), db);
        Wgmma<kHalf, false, false>(acc[1], SmemDescK(&sm.a[at.stage][64 * kBK + k * 16]), db);
      }
      WgmmaCommit();
      WgmmaWaitOne();
      if (prev >= 0 && t == 0) release(prev);
      prev = at.stage;
      at.Next();
    }
    MbarArrive(&sm.issued[c]);
    WgmmaWaitAll();
    if (prev >= 0 && t == 0) release(prev);
    SkipStages(at, k_blocks);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int i = 0; i < 64; ++i) KeepInRegisters(acc[h][i]);
    }
    const int32_t col0 = n_tile * kBN + (lane & 3) * 2;
    if (col0 + kBN - 2 >= a.vocab) MaskPadding<0>(acc, a.vocab - col0);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      TileEpilogue<1, kSumZ, kRowRef>(*reinterpret_cast<const float(*)[1][64]>(&acc[h]),
                                      row0 + h * 64, n_tile, m_tile * kBM + h * 64, c, y[h],
                                      reference[h], a, &e_map, sm.out[c]);
    }
  }
  // e must be in global memory before the kernel ends.
  if (t == 0) TmaStoreWaitAll();
#else
  __trap();  // built without sm_90a code: LogitsStatsSupported() is false there
#endif
}

// W tiles computed by CTA pairs sharing the hidden rows unless
// FLCE_CUDA_STATS_MULTICAST=0 (one CTA per tile; kept to compare the two).
bool StatsMulticast() {
  const char* env = std::getenv("FLCE_CUDA_STATS_MULTICAST");
  return env == nullptr || std::string(env) != "0";
}

// How many clusters of `kKernel` fit on the current device at once, asked
// once per device (0 if none: the caller then runs the single-CTA kernel).
template <auto kKernel>
int ResidentPairs() {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return 0;
  static std::mutex mu;
  static std::map<int, int> known;
  std::lock_guard<std::mutex> lock(mu);
  auto it = known.find(device);
  if (it != known.end()) return it->second;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(kPairCtas * std::max(SmCount(), 1));
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = kSharedBytes;
  cudaLaunchAttribute cluster;
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = kPairCtas;
  cluster.val.clusterDim.y = 1;
  cluster.val.clusterDim.z = 1;
  config.attrs = &cluster;
  config.numAttrs = 1;
  int clusters = 0;
  if (cudaOccupancyMaxActiveClusters(&clusters, kKernel, &config) != cudaSuccess) {
    (void)cudaGetLastError();  // not sticky: the single-CTA kernel runs instead
    clusters = 0;
  }
  known.emplace(device, clusters);
  return clusters;
}

template <bool kHalf, bool kSumZ, bool kRowRef>
absl::Status LaunchTyped(const Launch& l, cudaStream_t stream, DeviceHealth* health) {
  constexpr auto kSingle = PingPongKernel<kHalf, kSumZ, kRowRef, false>;
  constexpr auto kPaired = PingPongKernel<kHalf, kSumZ, kRowRef, true>;
  const KernelArgs& k = l.k;
  if (StatsMulticast()) {
    FLCE_CUDA_RETURN_IF_ERROR(AllowDynamicShared<kPaired>(kSharedBytes), health);
    const int resident = ResidentPairs<kPaired>();
    if (resident > 0) {
      const int64_t units =
          static_cast<int64_t>(k.m_tiles) * ((k.n_tiles + kPairCtas - 1) / kPairCtas);
      cudaLaunchConfig_t config = {};
      config.gridDim = dim3(static_cast<unsigned>(kPairCtas * std::min<int64_t>(units, resident)));
      config.blockDim = dim3(kThreads);
      config.dynamicSmemBytes = kSharedBytes;
      config.stream = stream;
      cudaLaunchAttribute cluster;
      cluster.id = cudaLaunchAttributeClusterDimension;
      cluster.val.clusterDim.x = kPairCtas;
      cluster.val.clusterDim.y = 1;
      cluster.val.clusterDim.z = 1;
      config.attrs = &cluster;
      config.numAttrs = 1;
      FLCE_CUDA_RETURN_IF_ERROR(
          cudaLaunchKernelEx(&config, kPaired, l.x_half_map, l.w_map, l.e_map, k), health);
      return absl::OkStatus();
    }
  }
  FLCE_CUDA_RETURN_IF_ERROR(AllowDynamicShared<kSingle>(kSharedBytes), health);
  const int64_t tiles = static_cast<int64_t>(k.m_tiles) * k.n_tiles;
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(tiles, std::max(SmCount(), 1)));
  kSingle<<<grid, kThreads, kSharedBytes, stream>>>(l.x_map, l.w_map, l.e_map, k);
  FLCE_CUDA_RETURN_IF_ERROR(cudaGetLastError(), health);
  return absl::OkStatus();
}

}  // namespace

absl::Status LaunchPingPong(DType dtype, bool sum_z, const Launch& l, cudaStream_t stream,
                            DeviceHealth* health) {
  if (l.k.row_reference != nullptr) return LaunchTyped<false, false, true>(l, stream, health);
  if (dtype == DType::kF16) {
    return sum_z ? LaunchTyped<true, true, false>(l, stream, health)
                 : LaunchTyped<true, false, false>(l, stream, health);
  }
  return sum_z ? LaunchTyped<false, true, false>(l, stream, health)
               : LaunchTyped<false, false, false>(l, stream, health);
}

}  // namespace flce::cuda::logits_stats
