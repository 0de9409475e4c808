// The chunked plan's two backward GEMMs as Hopper (sm_90a) kernels: TMA
// loads, wgmma, a producer warpgroup and two consumer warpgroups on
// 128 x 256 fp32 tiles, as in the logits-stats GEMM. How they compare with
// cuBLAS, alone and in whole runs: docs/perf/cuda.md.
//
//   grad_input: out = D . W   (D rows x cols, K-major; W cols x hidden, read
//               MN-major). With `splits` > 1 the vocabulary (K) is split into
//               contiguous ranges, each written to its own fp32 slab: more
//               tiles than SMs where rows x hidden alone would leave SMs idle,
//               and the slabs are summed in a fixed order afterwards (no
//               atomics: bitwise repeatable).
//   grad_W:     gw += D^T . X (both operands MN-major): each tile is added to
//               gw once by the copy engine (TMA reduce-add), so every element
//               gets exactly one fp32 add per chunk, in stream order. Two
//               kernels: the cooperative one above, and a ping-pong one on
//               192 x 128 tiles (grad_weight_pingpong.cuh) whose consumer
//               warpgroups take turns on the tensor cores, one reduce-adding
//               while the other's MMAs run. The ping-pong kernel can start
//               beside the grad_input kernel (a programmatic dependent
//               launch), taking the SMs of its last wave as they free up.
//
// bf16/fp16 operands, fp32 accumulation; cols a multiple of 128, hidden a
// multiple of 8, on a device of compute capability 9.0.
#ifndef FLCE_KERNELS_CUDA_OPS_SM90_BACKWARD_GEMM_CUH_
#define FLCE_KERNELS_CUDA_OPS_SM90_BACKWARD_GEMM_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "core/dtype.h"
#include "kernels/cuda/base/cuda_status.h"
#include "kernels/cuda/base/kernel_choices.h"

namespace flce::cuda {

// Device (compute capability 9.0) and head (bf16/fp16, H % 8 == 0). Which
// chunks the own kernels take: kernel_choices.h.
bool BackwardGemmSupported(DType dtype, int64_t hidden);

// How many vocabulary splits keep `sms` multiprocessors busy for grad_input
// of rows x hidden (1..max_splits, at most one per 64 columns of cols): the
// fewest that fill the last wave best, a split kept only if it fills it by
// more than 2 points. sms defaults to the current device's.
int GradInputSplits(int64_t rows, int64_t hidden, int64_t cols, int max_splits, int sms = 0);

struct GradInputGemmArgs {
  const void* d = nullptr;  // rows x cols, row stride cols
  const void* w = nullptr;  // cols x hidden
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t hidden = 0;
  float* out = nullptr;  // splits slabs of rows x hidden fp32, one after another
  int splits = 1;
};
absl::Status LaunchGradInputGemm(DType dtype, const GradInputGemmArgs& args, cudaStream_t stream,
                                 DeviceHealth* health);

struct GradWeightGemmArgs {
  const void* d = nullptr;  // rows x cols, row stride cols
  const void* x = nullptr;  // rows x hidden
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t hidden = 0;
  float* gw = nullptr;  // cols x hidden fp32, accumulated into
  GradWeightKernel kernel = GradWeightKernel::kPingPong;
  // Ping-pong kernel only. Zero at launch (the kernel counts on it): CTAs
  // take tiles as they ask for them, so CTAs that start late take fewer.
  // Null: each CTA takes every gridDim-th tile.
  int32_t* tile_counter = nullptr;
  // Ping-pong kernel only, with tile_counter: launched as a programmatic
  // dependent of the own grad_input GEMM just before it on the stream, its
  // CTAs start on the SMs that GEMM's last wave leaves idle.
  bool beside_grad_input = false;
  // Ping-pong kernel only, without tile_counter: CTA pairs over adjacent
  // hidden tiles, sharing each D^T tile by TMA multicast (from H > 128).
  bool cta_pairs = false;
};
absl::Status LaunchGradWeightGemm(DType dtype, const GradWeightGemmArgs& args, cudaStream_t stream,
                                  DeviceHealth* health);

}  // namespace flce::cuda

#endif  // FLCE_KERNELS_CUDA_OPS_SM90_BACKWARD_GEMM_CUH_
