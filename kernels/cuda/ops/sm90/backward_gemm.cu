#include <cuda.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "core/status_macros.h"
#include "kernels/cuda/base/sm90_support.h"
#include "kernels/cuda/ops/sm90/backward_gemm.cuh"
#include "kernels/cuda/ops/sm90/backward_gemm_tile.cuh"
#include "kernels/cuda/ops/sm90/grad_weight_pingpong.cuh"
#include "kernels/cuda/ops/sm90/sm90_primitives.cuh"

namespace flce::cuda {
namespace {

using namespace sm90;           // NOLINT: the kernel is written in these primitives
using namespace backward_tile;  // NOLINT: and this geometry

// The logits-stats GEMM's tile and stages: 128 x 256 outputs, kBK = 64 k
// per stage, four 48 KiB stages.
constexpr int kBM = 128;
constexpr int kBN = 256;
constexpr int kStages = 4;
constexpr int kConsumers = 2;
constexpr int kThreads = 128 * (kConsumers + 1);
constexpr uint32_t kStageBytes = (kBM + kBN) * kBK * 2;
// A consumer stages two fp32 output boxes at a time.
constexpr int kOutBoxes = 2;

struct alignas(1024) SharedTiles {
  uint16_t a[kStages][kBM * kBK];
  uint16_t b[kStages][kBN * kBK];
  float out[kConsumers][kOutBoxes][64 * kOutCols];
  uint64_t full[kStages];
  uint64_t empty[kStages];
};
constexpr size_t kSharedBytes = sizeof(SharedTiles) + 1024;  // + runtime 1 KiB alignment
static_assert(kSharedBytes <= 227 * 1024, "beyond Hopper's shared memory per block");

struct KernelArgs {
  int32_t m_tiles;
  int32_t n_tiles;
  int32_t splits;
  int32_t k_blocks;
};

// A work unit: N fastest, then M, then the split, so that the CTAs in
// flight share A's rows and B's k-range in L2; k-blocks [kb0, kb1).
struct Tile {
  int32_t m, n, split, kb0, kb1;
};
__device__ __forceinline__ Tile TileAt(int32_t index, const KernelArgs& a) {
  Tile t;
  t.n = index % a.n_tiles;
  t.m = (index / a.n_tiles) % a.m_tiles;
  t.split = index / (a.n_tiles * a.m_tiles);
  t.kb0 = static_cast<int32_t>(int64_t(t.split) * a.k_blocks / a.splits);
  t.kb1 = static_cast<int32_t>(int64_t(t.split + 1) * a.k_blocks / a.splits);
  return t;
}

#ifdef FLCE_SM90A
// A consumer's 64 x 256 accumulators (two n128 fragments side by side)
// out through its staging boxes: TMA stores into slab `split` (grad_input)
// or reduce-adds (grad_W).
template <bool kWeight>
__device__ __forceinline__ void StoreTile(const float (&acc)[2][64], int consumer, int col0,
                                          int row0, int split, const CUtensorMap* out_map,
                                          float (&boxes)[kOutBoxes][64 * kOutCols]) {
  StoreFragments(acc, consumer, boxes, [&](const float* box, int b) {
    if constexpr (kWeight) {
      TmaReduceAdd(out_map, box, col0 + b * kOutCols, row0);
    } else {
      TmaStore3d(out_map, box, col0 + b * kOutCols, row0, split);
    }
  });
}
#endif  // FLCE_SM90A

// kWeight = false: grad_input, A = D (rows x cols) K-major, K = cols split
// into `splits` ranges. kWeight = true: grad_W, A = D^T (cols x rows)
// MN-major, K = rows. B is MN-major in both (W: cols x hidden; X: rows x
// hidden).
template <bool kHalf, bool kWeight>
__global__ void __launch_bounds__(kThreads, 1)
    BackwardGemmKernel(const __grid_constant__ CUtensorMap a_map,
                       const __grid_constant__ CUtensorMap b_map,
                       const __grid_constant__ CUtensorMap out_map, const KernelArgs a) {
#ifdef FLCE_SM90A
  extern __shared__ uint8_t raw_shared[];
  SharedTiles& sm = AlignedShared<SharedTiles>(raw_shared);
  const int wg = threadIdx.x / 128;
  const int t = threadIdx.x % 128;
  const int32_t num_tiles = a.m_tiles * a.n_tiles * a.splits;
  InitStageBarriers(sm.full, sm.empty, kConsumers);
  // Every CTA is resident: a grad_W GEMM launched beside this one may take
  // the SMs of CTAs that finish (GradWeightGemmArgs::beside_grad_input).
  if constexpr (!kWeight) LetDependentGridStart();

  if (wg == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
    if (t != 0) return;
    StageCursor<kStages> at;
    for (int32_t index = blockIdx.x; index < num_tiles; index += gridDim.x) {
      const Tile tile = TileAt(index, a);
      if constexpr (kWeight) {
        PrefetchOutTile<kBM, kBN>(&out_map, tile.n * kBN, tile.m * kBM);
      }
      for (int32_t kb = tile.kb0; kb < tile.kb1; ++kb) {
        uint64_t* full = &sm.full[at.stage];
        MbarWait(&sm.empty[at.stage], at.phase ^ 1);
        MbarExpectTx(full, kStageBytes);
        if constexpr (kWeight) {
          for (int x = 0; x < kBM / kBox; ++x) {
            TmaLoad(&sm.a[at.stage][x * kBox * kBK], &a_map, full, tile.m * kBM + x * kBox,
                    kb * kBK);
          }
        } else {
          TmaLoad(sm.a[at.stage], &a_map, full, kb * kBK, tile.m * kBM);
        }
        for (int x = 0; x < kBN / kBox; ++x) {
          TmaLoad(&sm.b[at.stage][x * kBox * kBK], &b_map, full, tile.n * kBN + x * kBox, kb * kBK);
        }
        at.Next();
      }
    }
    return;
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
  const int c = wg - 1;
  StageCursor<kStages> at;
  float acc[2][64];
  for (int32_t index = blockIdx.x; index < num_tiles; index += gridDim.x) {
    const Tile tile = TileAt(index, a);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int i = 0; i < 64; ++i) acc[h][i] = 0.0f;
    }
    ConsumeStages(at, sm.full, sm.empty, tile.kb1 - tile.kb0, t == 0, [&](int stage) {
      // A: this consumer's 64 rows of the tile; k advances 16 columns,
      // 32 bytes (K-major), or 16 rows of 128 bytes (MN-major).
      const uint64_t a0 = kWeight ? SmemDescMN(&sm.a[stage][c * kBox * kBK], kBoxBytes)
                                  : SmemDescK(&sm.a[stage][c * 64 * kBK]);
      const uint32_t a_step = kWeight ? 16 * kBox * 2 : 32;
      const uint64_t b0[2] = {SmemDescMN(&sm.b[stage][0], kBoxBytes),
                              SmemDescMN(&sm.b[stage][2 * kBox * kBK], kBoxBytes)};
#pragma unroll
      for (int k = 0; k < kBK / 16; ++k) {
        const uint64_t da = DescAdvance(a0, k * a_step);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          Wgmma<kHalf, kWeight, true>(acc[h], da, DescAdvance(b0[h], k * 16 * kBox * 2));
        }
      }
    });
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int i = 0; i < 64; ++i) KeepInRegisters(acc[h][i]);
    }
    StoreTile<kWeight>(acc, c, tile.n * kBN, tile.m * kBM + c * 64, tile.split, &out_map,
                       sm.out[c]);
  }
  // The outputs must be in global memory before the kernel ends.
  if (t == 0) TmaStoreWaitAll();
#else
  __trap();  // built without sm_90a code: BackwardGemmSupported() is false there
#endif
}

template <bool kHalf, bool kWeight>
absl::Status Launch(const CUtensorMap& a_map, const CUtensorMap& b_map, const CUtensorMap& out_map,
                    const KernelArgs& k, cudaStream_t stream, DeviceHealth* health) {
  const cudaError_t allowed = AllowDynamicShared<BackwardGemmKernel<kHalf, kWeight>>(kSharedBytes);
  FLCE_CUDA_RETURN_IF_ERROR(allowed, health);
  const int64_t tiles = static_cast<int64_t>(k.m_tiles) * k.n_tiles * k.splits;
  PersistentLaunch launch(tiles, /*cluster=*/1, kThreads, kSharedBytes, stream);
  FLCE_CUDA_RETURN_IF_ERROR(cudaLaunchKernelEx(launch.config(), BackwardGemmKernel<kHalf, kWeight>,
                                               a_map, b_map, out_map, k),
                            health);
  return absl::OkStatus();
}

absl::Status CheckLayout(const char* what, DType dtype, const void* d, int64_t rows, int64_t cols,
                         int64_t hidden) {
  if (dtype != DType::kBF16 && dtype != DType::kF16) {
    return absl::InternalError(std::string(what) + ": needs bf16 or fp16 operands");
  }
  if (cols % kBM != 0 || hidden % 8 != 0 || rows > INT32_MAX / 2 || cols > INT32_MAX / 2 ||
      reinterpret_cast<uintptr_t>(d) % 16 != 0) {
    return absl::InternalError(std::string(what) + ": unsupported layout");
  }
  return absl::OkStatus();
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

bool BackwardGemmSupported(DType dtype, int64_t hidden) {
  return HeadFitsHopperKernels(dtype, hidden);
}

int GradInputSplits(int64_t rows, int64_t hidden, int64_t cols, int max_splits, int sms_given) {
  const int64_t sms = std::max(sms_given > 0 ? sms_given : SmCount(), 1);
  const int64_t tiles = CeilDiv(rows, kBM) * CeilDiv(hidden, kBN);
  const int64_t k_blocks = cols / kBK;
  auto fill_with = [&](int s) {
    const int64_t work = tiles * s;
    return static_cast<double>(work) / static_cast<double>(CeilDiv(work, sms) * sms);
  };
  int best = 1;
  double best_fill = fill_with(1);
  for (int s = 2; s <= max_splits && s <= k_blocks; ++s) {
    const double fill = fill_with(s);
    // A split must fill the waves noticeably better to be worth its slab.
    if (fill > best_fill + 0.02) {
      best = s;
      best_fill = fill;
    }
  }
  return best;
}

absl::Status LaunchGradInputGemm(DType dtype, const GradInputGemmArgs& args, cudaStream_t stream,
                                 DeviceHealth* health) {
  if (args.rows == 0 || args.hidden == 0) return absl::OkStatus();
  FLCE_RETURN_IF_ERROR(
      CheckLayout("grad_input GEMM", dtype, args.d, args.rows, args.cols, args.hidden));
  if (args.splits < 1 || args.splits > args.cols / kBK) {
    return absl::InternalError("grad_input GEMM: bad split count");
  }
  CUtensorMap a_map, b_map, out_map;
  FLCE_RETURN_IF_ERROR(EncodeMatrix(&a_map, dtype, args.d, args.rows, args.cols, kBK, kBM));
  FLCE_RETURN_IF_ERROR(EncodeMatrix(&b_map, dtype, args.w, args.cols, args.hidden, kBox, kBK));
  TensorMapShape slabs;
  slabs.rank = 3;
  slabs.dims[0] = static_cast<uint64_t>(args.hidden);
  slabs.dims[1] = static_cast<uint64_t>(args.rows);
  slabs.dims[2] = static_cast<uint64_t>(args.splits);
  slabs.row_bytes[0] = static_cast<uint64_t>(args.hidden) * 4;
  slabs.row_bytes[1] = static_cast<uint64_t>(args.rows * args.hidden) * 4;
  slabs.box[0] = kOutCols;
  slabs.box[1] = 64;
  slabs.box[2] = 1;
  FLCE_RETURN_IF_ERROR(EncodeTensorMap(&out_map, DType::kF32, args.out, slabs));
  KernelArgs k;
  k.m_tiles = static_cast<int32_t>(CeilDiv(args.rows, kBM));
  k.n_tiles = static_cast<int32_t>(CeilDiv(args.hidden, kBN));
  k.splits = args.splits;
  k.k_blocks = static_cast<int32_t>(args.cols / kBK);
  return dtype == DType::kF16 ? Launch<true, false>(a_map, b_map, out_map, k, stream, health)
                              : Launch<false, false>(a_map, b_map, out_map, k, stream, health);
}

absl::Status LaunchGradWeightGemm(DType dtype, const GradWeightGemmArgs& args, cudaStream_t stream,
                                  DeviceHealth* health) {
  if (args.rows == 0 || args.hidden == 0) return absl::OkStatus();
  FLCE_RETURN_IF_ERROR(
      CheckLayout("grad_W GEMM", dtype, args.d, args.rows, args.cols, args.hidden));
  if (args.kernel == GradWeightKernel::kPingPong) {
    if (args.beside_grad_input && args.tile_counter == nullptr) {
      return absl::InternalError("grad_W GEMM beside grad_input needs a tile counter");
    }
    if (args.cta_pairs && args.tile_counter != nullptr) {
      return absl::InternalError("grad_W GEMM: CTA pairs take static tiles, not a tile counter");
    }
    return LaunchGradWeightPingPong(dtype, args, stream, health);
  }
  if (args.tile_counter != nullptr || args.beside_grad_input || args.cta_pairs) {
    return absl::InternalError(
        "grad_W GEMM: tile counter, overlap and CTA pairs are the ping-pong kernel's");
  }
  CUtensorMap a_map, b_map, out_map;
  FLCE_RETURN_IF_ERROR(EncodeMatrix(&a_map, dtype, args.d, args.rows, args.cols, kBox, kBK));
  FLCE_RETURN_IF_ERROR(EncodeMatrix(&b_map, dtype, args.x, args.rows, args.hidden, kBox, kBK));
  FLCE_RETURN_IF_ERROR(
      EncodeMatrix(&out_map, DType::kF32, args.gw, args.cols, args.hidden, kOutCols, 64));
  KernelArgs k;
  k.m_tiles = static_cast<int32_t>(args.cols / kBM);
  k.n_tiles = static_cast<int32_t>(CeilDiv(args.hidden, kBN));
  k.splits = 1;
  k.k_blocks = static_cast<int32_t>(CeilDiv(args.rows, kBK));
  return dtype == DType::kF16 ? Launch<true, true>(a_map, b_map, out_map, k, stream, health)
                              : Launch<false, true>(a_map, b_map, out_map, k, stream, health);
}

}  // namespace flce::cuda
