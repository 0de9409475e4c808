// Checks of rows that never pass through host memory (hidden read from and
// grad_input written to a peer process's device memory): the first
// non-finite element, and DeviceHiddenFingerprint (kernels/engine.h), the
// same facts the host path takes from the bytes.
#ifndef FLCE_KERNELS_CUDA_OPS_PEER_ROW_KERNELS_CUH_
#define FLCE_KERNELS_CUDA_OPS_PEER_ROW_KERNELS_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "core/dtype.h"
#include "kernels/cuda/base/cuda_status.h"

namespace flce::cuda {

// What the checks accumulate on the device; reset to Fresh() before use.
struct RowCheckWords {
  unsigned long long first_non_finite;  // min element index; ~0 = none
  unsigned long long fingerprint;       // wrapping sum of row terms
  static RowCheckWords Fresh() { return RowCheckWords{~0ull, 0ull}; }
};

// Over rows [0, n) of H elements of `dtype` at `rows`: atomicMin of
// (index_base + r * H + column) for each non-finite element into
// words->first_non_finite, and (with fingerprint) the rows' terms, token
// first_token + r, added to words->fingerprint.
absl::Status LaunchCheckRows(DType dtype, const void* rows, int64_t n, int64_t hidden_size,
                             int64_t first_token, int64_t index_base, bool fingerprint,
                             RowCheckWords* words, cudaStream_t stream, DeviceHealth* health);

}  // namespace flce::cuda

#endif  // FLCE_KERNELS_CUDA_OPS_PEER_ROW_KERNELS_CUH_
