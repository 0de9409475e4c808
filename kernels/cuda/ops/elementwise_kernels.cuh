// Small elementwise kernels: dtype conversion of hidden / grad_input rows
// (bf16, fp16, fp32 in any direction), y += alpha * x over fp32 gradient
// buffers (with finiteness flags for landing gradients), and a deliberate device fault used only by tests of the sticky
// error path. Nothing here is materialised beyond its output.
#ifndef FLCE_KERNELS_CUDA_OPS_ELEMENTWISE_KERNELS_CUH_
#define FLCE_KERNELS_CUDA_OPS_ELEMENTWISE_KERNELS_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "core/dtype.h"
#include "kernels/cuda/base/cuda_status.h"

namespace flce::cuda {

absl::Status LaunchConvert(DType src_dtype, const void* src, DType dst_dtype, void* dst,
                           int64_t count, cudaStream_t stream, DeviceHealth* health);

// count elements of `dtype` set to 1 (the ones vector of the bias GEMM).
absl::Status LaunchFillOnes(DType dtype, void* dst, int64_t count, cudaStream_t stream,
                            DeviceHealth* health);

// y[i] += alpha * x[i], fp32.
absl::Status LaunchAxpy(float alpha, const float* x, float* y, int64_t count,
                        cudaStream_t stream, DeviceHealth* health);

// inout[i] = base[i] + scale * inout[i], fp32, OR-ing into *flags bit 0 when
// a contribution (scale * inout[i]) is not finite and bit 1 when a sum is not.
// *flags must be zeroed before.
absl::Status LaunchScaleAddChecked(float scale, const float* base, float* inout, int64_t count,
                                   unsigned* flags, cudaStream_t stream, DeviceHealth* health);

// OR-s 1 into *flags when any of x[0..count) is not finite.
absl::Status LaunchCheckFinite(const float* x, int64_t count, unsigned* flags,
                               cudaStream_t stream, DeviceHealth* health);

// Writes through an invalid address: the context becomes unusable. Tests only.
absl::Status LaunchDeviceFault(cudaStream_t stream, DeviceHealth* health);

}  // namespace flce::cuda

#endif  // FLCE_KERNELS_CUDA_OPS_ELEMENTWISE_KERNELS_CUH_
