#include <cuda.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/logits_stats_gemm.cuh"
#include "kernels/cuda/logits_stats_tile.cuh"
#include "kernels/status_macros.h"

namespace flce::cuda {
namespace logits_stats {
namespace {

// The cooperative kernel: 128 tokens x 256 vocabulary columns per tile, both
// consumer warpgroups on one tile (64 rows each), four stages of 48 KiB. Its
// epilogue leaves the tensor cores idle; at H >= 4096 that is a small share
// of a tile and its mainloop is the fastest (docs/perf/cuda.md step 22).
constexpr int kBN = 256;
constexpr int kStages = 4;
constexpr uint32_t kStageBytes = (kBM + kBN) * kBK * 2;

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

// The tile order: groups of m_group token tiles, token tiles fastest within
// a group, a group's every W tile before the next group. The CTAs in flight
// share a few W tiles and the group's hidden rows (by default the group is
// the whole chunk: a few MiB at H = 1024).
struct TileAt {
  int32_t m, n;
  __device__ TileAt(int32_t tile, const KernelArgs& a) {
    const int32_t per_group = a.m_group * a.n_tiles;
    const int32_t group = tile / per_group;
    const int32_t rest = tile - group * per_group;
    const int32_t rows = min(a.m_group, a.m_tiles - group * a.m_group);
    m = group * a.m_group + rest % rows;
    n = rest / rows;
  }
};

template <bool kHalf, bool kSumZ, bool kRowRef>
__global__ void __launch_bounds__(kThreads, 1)
    CooperativeKernel(const __grid_constant__ CUtensorMap x_map,
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
    StageCursor<kStages> at;
    for (int32_t tile = blockIdx.x; tile < num_tiles; tile += gridDim.x) {
      const TileAt at_tile(tile, a);
      const int32_t m_tile = at_tile.m;
      const int32_t n_tile = at_tile.n;
      for (int32_t kb = 0; kb < k_blocks; ++kb) {
        MbarWait(&sm.empty[at.stage], at.phase ^ 1);
        MbarExpectTx(&sm.full[at.stage], kStageBytes);
        TmaLoad(sm.a[at.stage], &x_map, &sm.full[at.stage], kb * kBK, m_tile * kBM);
        TmaLoad(sm.b[at.stage], &w_map, &sm.full[at.stage], kb * kBK, n_tile * kBN);
        at.Next();
      }
    }
    return;
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
  const int c = wg - 1;
  const int warp = t / 32;
  const int lane = t % 32;
  StageCursor<kStages> at;
  float acc[2][64];
  for (int32_t tile = blockIdx.x; tile < num_tiles; tile += gridDim.x) {
    const TileAt at_tile(tile, a);
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
#pragma unroll
      for (int k = 0; k < kBK / 16; ++k) {
        const uint64_t da = SmemDescK(&sm.a[stage][c * 64 * kBK + k * 16]);
        Wgmma<kHalf, false, false>(acc[0], da, SmemDescK(&sm.b[stage][k * 16]));
        Wgmma<kHalf, false, false>(acc[1], da, SmemDescK(&sm.b[stage][128 * kBK + k * 16]));
      }
    });
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int i = 0; i < 64; ++i) KeepInRegisters(acc[h][i]);
    }
    const int32_t col0 = n_tile * kBN + (lane & 3) * 2;
    if (col0 + kBN - 2 >= a.vocab) MaskPadding<128>(acc, a.vocab - col0);
    TileEpilogue<2, kSumZ, kRowRef>(acc, row0, n_tile, m_tile * kBM + c * 64, c, y, reference, a,
                                    &e_map, sm.out[c]);
  }
  // e must be in global memory before the kernel ends.
  if (t == 0) TmaStoreWaitAll();
#else
  __trap();  // built without sm_90a code: LogitsStatsSupported() is false there
#endif
}

template <bool kHalf, bool kSumZ, bool kRowRef>
absl::Status LaunchCooperative(const Launch& l, cudaStream_t stream, DeviceHealth* health) {
  const KernelArgs& k = l.k;
  const cudaError_t allowed =
      AllowDynamicShared<CooperativeKernel<kHalf, kSumZ, kRowRef>>(kSharedBytes);
  FLCE_CUDA_RETURN_IF_ERROR(allowed, health);
  const int64_t tiles = static_cast<int64_t>(k.m_tiles) * k.n_tiles;
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(tiles, std::max(SmCount(), 1)));
  CooperativeKernel<kHalf, kSumZ, kRowRef>
      <<<grid, kThreads, kSharedBytes, stream>>>(l.x_map, l.w_map, l.e_map, k);
  FLCE_CUDA_RETURN_IF_ERROR(cudaGetLastError(), health);
  return absl::OkStatus();
}

// One group by default (the whole chunk, token tiles fastest).
// FLCE_CUDA_STATS_GROUP=G: groups of G token tiles, so that G x 128 hidden
// rows stay in L2 while the group sweeps W (a 5632-token chunk at H = 4096
// is 44 MiB). Measured 2026-12-02 on two H200 leases: G = 16 was 0.7 ms
// faster at 16384 x 4096 x 151936 in one and 1.5 ms slower in the other;
// no robust gain at any bench shape (docs/perf/cuda.md step 21).
int32_t TokenTilesPerGroup(int32_t m_tiles) {
  const char* env = std::getenv("FLCE_CUDA_STATS_GROUP");
  const int group = env != nullptr ? std::atoi(env) : 0;
  return group > 0 && group < m_tiles ? group : m_tiles;
}

}  // namespace
}  // namespace logits_stats

int64_t LogitsStatsTileCols(int64_t hidden) {
  // Read once: the workspace a plan sizes and the partials a launch writes
  // must agree for the life of the process.
  static const std::string choice = [] {
    const char* env = std::getenv("FLCE_CUDA_STATS_KERNEL");
    return std::string(env != nullptr ? env : "");
  }();
  if (choice == "pingpong") return 128;
  if (choice == "cooperative") return 256;
  return hidden <= kPingPongMaxHidden ? 128 : 256;
}

bool LogitsStatsSupported(DType dtype, int64_t hidden) {
  const char* env = std::getenv("FLCE_CUDA_LOGITS");
  if (env != nullptr && std::string(env) == "cublas") return false;
  return sm90::HeadFitsHopperKernels(dtype, hidden);
}

absl::Status LaunchLogitsStats(DType dtype, const LogitsStatsArgs& args, cudaStream_t stream,
                               DeviceHealth* health) {
  using logits_stats::Launch;
  if (args.rows == 0) return absl::OkStatus();
  if (args.hidden % 8 != 0 || args.padded_vocab % 128 != 0 || args.vocab > args.padded_vocab ||
      args.rows > INT32_MAX / 2 || args.padded_vocab > INT32_MAX / 2) {
    return absl::InternalError("logits-stats GEMM: unsupported layout");
  }
  if (reinterpret_cast<uintptr_t>(args.exp_out) % 16 != 0) {
    return absl::InternalError("logits-stats GEMM: e buffer not 16-byte aligned");
  }
  const int64_t tile_cols = LogitsStatsTileCols(args.hidden);
  if (args.row_reference != nullptr && (dtype != DType::kBF16 || args.sum_z)) {
    // Row-scaled e feeds cuBLAS next to W, so it takes W's dtype: bf16 (fp16's
    // range would not hold exp(z - M_t)).
    return absl::InternalError("logits-stats GEMM: row-scaled e needs bf16 and no sum z");
  }
  absl::StatusOr<Launch> l = logits_stats::PrepareLaunch(dtype, args, tile_cols);
  if (!l.ok()) return l.status();
  if (tile_cols == 128) return logits_stats::LaunchPingPong(dtype, args.sum_z, *l, stream, health);
  l->k.m_group = logits_stats::TokenTilesPerGroup(l->k.m_tiles);
  using logits_stats::LaunchCooperative;
  if (args.row_reference != nullptr) return LaunchCooperative<false, false, true>(*l, stream, health);
  if (dtype == DType::kF16) {
    return args.sum_z ? LaunchCooperative<true, true, false>(*l, stream, health)
                      : LaunchCooperative<true, false, false>(*l, stream, health);
  }
  return args.sum_z ? LaunchCooperative<false, true, false>(*l, stream, health)
                    : LaunchCooperative<false, false, false>(*l, stream, health);
}

}  // namespace flce::cuda
