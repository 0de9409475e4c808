// The chunked plan's single-pass row kernel: one thread-block cluster per
// logits row. Each block copies its segment of the row's fp32 logits into
// shared memory (cp.async, read from device memory exactly once), computes
// the segment's online max / sum-exp / entropy / argmax state, the cluster
// merges the states through distributed shared memory in a fixed order
// (deterministic), and each block then writes its segment's dlogits in the
// head's dtype from shared memory, in place at the row's start. Same math and
// outputs as fused_row_kernel.cuh (row_math.cuh), one device read less per
// element. Never materialised: probabilities, a second logits buffer.
//
// Hazard: a block's narrow dlogits overlap fp32 bytes of lower-ranked
// blocks' segments; every block has finished loading before the first
// cluster barrier, and all writes come after it.
#ifndef FLCE_KERNELS_CUDA_OPS_CLUSTER_ROW_KERNEL_CUH_
#define FLCE_KERNELS_CUDA_OPS_CLUSTER_ROW_KERNEL_CUH_

#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "core/dtype.h"
#include "kernels/cuda/base/cuda_status.h"
#include "kernels/cuda/ops/fused_row_kernel.cuh"

namespace flce::cuda {

// Cluster size for a padded vocabulary, or 0 when a row does not fit in
// ClusterRowPolicy::kMaxCluster blocks (then use LaunchFusedRows).
int ClusterSizeFor(int64_t padded_vocab);
// Whether LaunchClusterRows runs rows of padded_vocab on this device.
bool ClusterRowsFit(int64_t padded_vocab);

// Like LaunchFusedRows for the in-place chunked case (args.probs must be
// null; dlogits null or equal to logits). FAILED_PRECONDITION when the device
// cannot run the cluster shape: the caller falls back to LaunchFusedRows.
absl::Status LaunchClusterRows(DType dtype, const FusedRowArgs& args, cudaStream_t stream,
                               DeviceHealth* health);

}  // namespace flce::cuda

#endif  // FLCE_KERNELS_CUDA_OPS_CLUSTER_ROW_KERNEL_CUH_
