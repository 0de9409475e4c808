// grad_W on a ping-pong Hopper (sm_90a) kernel: 192 x 128 tiles, each
// consumer warpgroup owning whole tiles and reduce-adding one while the
// other's MMAs run. LaunchGradWeightGemm (backward_gemm.cuh) checks the
// layout and picks this kernel or the cooperative one.
#ifndef FLCE_KERNELS_CUDA_OPS_SM90_GRAD_WEIGHT_PINGPONG_CUH_
#define FLCE_KERNELS_CUDA_OPS_SM90_GRAD_WEIGHT_PINGPONG_CUH_

#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "core/dtype.h"
#include "kernels/cuda/base/cuda_status.h"
#include "kernels/cuda/ops/sm90/backward_gemm.cuh"

namespace flce::cuda {

absl::Status LaunchGradWeightPingPong(DType dtype, const GradWeightGemmArgs& args,
                                      cudaStream_t stream, DeviceHealth* health);

}  // namespace flce::cuda

#endif  // FLCE_KERNELS_CUDA_OPS_SM90_GRAD_WEIGHT_PINGPONG_CUH_
