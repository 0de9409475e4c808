// The fuse_mn plan's backward (verl's _Total_Fuse_MN): one block per
// (64 tokens x 64 vocab) tile recomputes the tile's logits from X and W,
// forms dlogits in shared memory from the per-row LSE of a prior stats pass,
// and atomically adds its share into grad_input (an fp32 accumulator) and
// grad_W (and grad_b). Never materialised: any logits or dlogits beyond one
// tile. The fp32 atomics make the summation order run-dependent: this plan
// cannot be deterministic. Plain fp32 FMA tiles, not tensor cores: it exists
// as the reference point for the atomics design and is slow at large V.
#ifndef FLCE_KERNELS_CUDA_OPS_FUSE_MN_KERNEL_CUH_
#define FLCE_KERNELS_CUDA_OPS_FUSE_MN_KERNEL_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "core/dtype.h"
#include "kernels/cuda/base/cuda_status.h"
#include "kernels/cuda/base/row_types.h"

namespace flce::cuda {

struct FuseMNArgs {
  const void* x = nullptr;       // rows x H, head dtype
  const void* w = nullptr;       // padded_vocab x H, head dtype
  const void* bias = nullptr;    // padded_vocab, head dtype, or null
  int64_t rows = 0;
  int64_t hidden = 0;
  int64_t padded_vocab = 0;
  const RowGrad* grad = nullptr;  // per row, from the stats pass
  float* grad_input = nullptr;    // rows x H fp32 accumulator, or null
  float* grad_weight = nullptr;   // padded_vocab x H fp32, or null
  float* grad_bias = nullptr;     // padded_vocab fp32, or null
  LossParams params;
};

absl::Status LaunchFuseMN(DType dtype, const FuseMNArgs& args, cudaStream_t stream,
                          DeviceHealth* health);

}  // namespace flce::cuda

#endif  // FLCE_KERNELS_CUDA_OPS_FUSE_MN_KERNEL_CUH_
