// Host side of the Hopper GEMM kernels: TMA tensor maps and the device checks
// that decide whether they may run.
#ifndef FLCE_KERNELS_CUDA_BASE_SM90_SUPPORT_H_
#define FLCE_KERNELS_CUDA_BASE_SM90_SUPPORT_H_

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "core/dtype.h"

namespace flce::cuda::sm90 {

// A row-major tensor of `rank` (2 or 3) dimensions, innermost first, for TMA
// boxes of `box` elements in the 128-byte swizzle. `row_bytes[i]` is the
// stride of dimension i + 1 in bytes (multiples of 16).
struct TensorMapShape {
  int rank = 2;
  uint64_t dims[3] = {0, 0, 1};
  uint64_t row_bytes[2] = {0, 0};
  uint32_t box[3] = {0, 0, 1};
};

// dtype: kBF16 / kF16 / kF32.
absl::Status EncodeTensorMap(CUtensorMap* map, DType dtype, const void* base,
                             const TensorMapShape& shape);

// A rows x cols row-major matrix in boxes of box_cols x box_rows.
absl::Status EncodeMatrix(CUtensorMap* map, DType dtype, const void* base, int64_t rows,
                          int64_t cols, uint32_t box_cols, uint32_t box_rows);

// The current device's multiprocessors (0 if unknown).
int SmCount();
// Compute capability 9.0 with cuTensorMapEncodeTiled available.
bool DeviceIsSm90();
// Whether the Hopper GEMMs can take a head: bf16/fp16, H a multiple of 8
// (TMA's 16-byte strides), on a compute capability 9.0 device (what the plans
// take: kernel_choices.h's HopperKernelsFor).
bool HeadFitsHopperKernels(DType dtype, int64_t hidden);

// The launch of a persistent kernel: `units` of work, each taken by a cluster
// of `cluster` CTAs (1: plain CTAs), as many clusters as the SMs hold
// (SmCount() / cluster) and no more than there are units. Optionally a
// programmatic dependent of the kernel before it on the stream.
class PersistentLaunch {
 public:
  PersistentLaunch(int64_t units, int cluster, int threads, size_t shared_bytes,
                   cudaStream_t stream);
  PersistentLaunch(const PersistentLaunch&) = delete;
  PersistentLaunch& operator=(const PersistentLaunch&) = delete;
  void StartBesidePrevious();
  const cudaLaunchConfig_t* config();

 private:
  cudaLaunchConfig_t config_ = {};
  cudaLaunchAttribute attrs_[2] = {};
  int num_attrs_ = 0;
};

}  // namespace flce::cuda::sm90

#endif  // FLCE_KERNELS_CUDA_BASE_SM90_SUPPORT_H_
