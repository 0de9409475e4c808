// grad_W for a chunk of a few rows: gw[cols x H] (fp32) += D[rows x cols]^T .
// X[rows x H] as one streaming pass over the accumulator. With K = rows this
// small the product is a read and a write of V x H floats (545 MB each at
// V = 151937, H = 896) and a GEMM's tiles have nothing to reuse; each thread
// adds the rows' products to four adjacent accumulator entries in row order,
// one fused multiply-add each (for one row, the same rounding as cuBLAS's
// C + A.B).
#ifndef FLCE_KERNELS_CUDA_OPS_THIN_GRAD_WEIGHT_CUH_
#define FLCE_KERNELS_CUDA_OPS_THIN_GRAD_WEIGHT_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "core/dtype.h"
#include "kernels/cuda/base/cuda_status.h"
#include "kernels/cuda/base/kernel_choices.h"

namespace flce::cuda {

// At most kThinGradWeightRows rows (kernel_choices.h says which chunks take
// it). d: rows x cols, row stride ld_d elements; x: rows x hidden, dense; both in
// `dtype`. gw: cols x hidden fp32, dense.
absl::Status LaunchThinGradWeight(DType dtype, const void* d, int64_t ld_d, const void* x,
                                  int64_t rows, int64_t cols, int64_t hidden, float* gw,
                                  cudaStream_t stream, DeviceHealth* health);

}  // namespace flce::cuda

#endif  // FLCE_KERNELS_CUDA_OPS_THIN_GRAD_WEIGHT_CUH_
