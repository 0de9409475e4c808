// The tied embedding on the device: gathering weight rows by token id (the
// input embedding's lookup) and scatter-adding gradient rows into an fp32
// grad_W (its backward), with or without a fixed summation order.
#ifndef FLCE_KERNELS_CUDA_OPS_EMBEDDING_KERNELS_CUH_
#define FLCE_KERNELS_CUDA_OPS_EMBEDDING_KERNELS_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "core/dtype.h"
#include "kernels/cuda/base/cuda_status.h"

namespace flce::cuda {

// out[i, :] = weight[ids[i], :] (weight_dtype), written as out_dtype (the
// weight's dtype or fp32). ids are already checked to lie in [0, V).
absl::Status LaunchGatherRows(const void* weight, DType weight_dtype, int64_t hidden,
                              const int32_t* ids, int64_t n, void* out, DType out_dtype,
                              cudaStream_t stream, DeviceHealth* health);

// grad[ids[i], :] += rows[i, :] (rows_dtype), fp32. deterministic: each
// column is summed by one thread in the order of i (no atomics); otherwise
// atomicAdd, in whatever order the hardware takes.
absl::Status LaunchScatterAddRows(float* grad, int64_t hidden, const int32_t* ids, int64_t n,
                                  const void* rows, DType rows_dtype, bool deterministic,
                                  cudaStream_t stream, DeviceHealth* health);

}  // namespace flce::cuda

#endif  // FLCE_KERNELS_CUDA_OPS_EMBEDDING_KERNELS_CUH_
