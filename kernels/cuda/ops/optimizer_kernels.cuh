// The CUDA engine's optimizer passes over one parameter group: a read-only
// check (would this step leave every weight finite?), the update itself
// (master, moments and the served weight in one pass), and the fp64 sum of
// squares of a gradient. The per-element math is kernels/optimizer_math.h.
#ifndef FLCE_KERNELS_CUDA_OPS_OPTIMIZER_KERNELS_CUH_
#define FLCE_KERNELS_CUDA_OPS_OPTIMIZER_KERNELS_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "core/dtype.h"
#include "kernels/cuda/base/cuda_status.h"
#include "kernels/optimizer.h"
#include "kernels/optimizer_math.h"

namespace flce::cuda {

// One parameter group's device arrays, `count` elements each. Null m / v /
// vmax: the kind keeps no such state (StateArraysFor).
struct OptimizerArrays {
  const float* grad = nullptr;
  float* params = nullptr;  // the fp32 master, or an fp32 head's weight itself
  float* m = nullptr;
  float* v = nullptr;
  float* vmax = nullptr;
  void* served = nullptr;  // a 16-bit head's weight, rounded from params; null for fp32
  DType served_dtype = DType::kF32;
  int64_t count = 0;
};

// ORs ElementCheck bits into *flags (zeroed before); writes nothing else.
absl::Status LaunchOptimizerCheck(OptimizerKind kind, const ElementStep& step,
                                  const OptimizerArrays& arrays, unsigned* flags,
                                  cudaStream_t stream, DeviceHealth* health);
absl::Status LaunchOptimizerApply(OptimizerKind kind, const ElementStep& step,
                                  const OptimizerArrays& arrays, cudaStream_t stream,
                                  DeviceHealth* health);

// Blocks of the sum of squares' first pass: `partials` holds this many doubles.
inline constexpr int kSumOfSquaresBlocks = 1024;

// *out = sum of x[i]^2 in fp64, in a fixed order (the same x gives the same bits).
absl::Status LaunchSumOfSquares(const float* x, int64_t count, double* partials, double* out,
                                cudaStream_t stream, DeviceHealth* health);

}  // namespace flce::cuda

#endif  // FLCE_KERNELS_CUDA_OPS_OPTIMIZER_KERNELS_CUH_
