// The backward GEMM kernels' shared geometry and steps: the cooperative
// kernels of backward_gemm.cu and the ping-pong grad_W kernel of
// grad_weight_pingpong.cu. Device code for sm_90a only; included by those
// two files alone.
#ifndef FLCE_KERNELS_CUDA_OPS_SM90_BACKWARD_GEMM_TILE_CUH_
#define FLCE_KERNELS_CUDA_OPS_SM90_BACKWARD_GEMM_TILE_CUH_

#include <cuda.h>

#include <cstdint>

#include "kernels/cuda/ops/sm90/sm90_primitives.cuh"

namespace flce::cuda::backward_tile {

// 64 k per stage: one 128-byte swizzle row of 16-bit elements.
constexpr int kBK = 64;
// MN-major operands arrive as boxes of 64 M/N elements x 64 k (8 KiB).
constexpr int kBox = 64;
constexpr uint32_t kBoxBytes = kBox * kBK * 2;
// fp32 outputs leave through shared memory in boxes of 32 columns (one
// 128-byte swizzle row) x 64 rows.
constexpr int kOutCols = 32;

#ifdef FLCE_SM90A
// A kRows x kCols tile of grad_W from (col0, row0) into L2, box by box, while
// the tile's mainloop runs: its epilogue's reduce-adds then find the rows
// there instead of in DRAM.
template <int kRows, int kCols>
__device__ __forceinline__ void PrefetchOutTile(const CUtensorMap* out_map, int col0, int row0) {
  for (int y = 0; y < kRows; y += 64) {
    for (int x = 0; x < kCols; x += kOutCols) sm90::TmaPrefetchL2(out_map, col0 + x, row0 + y);
  }
}
#endif  // FLCE_SM90A

}  // namespace flce::cuda::backward_tile

#endif  // FLCE_KERNELS_CUDA_OPS_SM90_BACKWARD_GEMM_TILE_CUH_
