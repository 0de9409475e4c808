#include <algorithm>

#include "kernels/cuda/ops/peer_row_kernels.cuh"
#include "kernels/device_fingerprint.h"

namespace flce::cuda {
namespace {

constexpr int kThreads = 256;

// Exponent all ones = Inf or NaN, for each dtype's layout.
__device__ __forceinline__ bool NonFiniteBits(uint32_t bits, int kind) {
  switch (kind) {
    case 0:
      return (bits & 0x7f800000u) == 0x7f800000u;  // fp32
    case 1:
      return (bits & 0x7c00u) == 0x7c00u;  // fp16
    default:
      return (bits & 0x7f80u) == 0x7f80u;  // bf16
  }
}

template <typename Word>
__global__ void CheckRowsKernel(const Word* __restrict__ rows, int64_t n, int64_t hidden,
                                int64_t first_token, int64_t index_base, int kind,
                                bool fingerprint, RowCheckWords* words) {
  __shared__ unsigned long long partial[kThreads / 32];
  for (int64_t r = blockIdx.x; r < n; r += gridDim.x) {
    const Word* row = rows + r * hidden;
    unsigned long long sum = 0;
    unsigned long long bad = ~0ull;
    for (int64_t j = threadIdx.x; j < hidden; j += kThreads) {
      const uint32_t bits = row[j];
      if (NonFiniteBits(bits, kind) && bad == ~0ull) {
        bad = static_cast<unsigned long long>(index_base + r * hidden + j);
      }
      if (fingerprint) sum += ElementTerm(bits, j);
    }
    if (bad != ~0ull) atomicMin(&words->first_non_finite, bad);
    if (!fingerprint) continue;
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_down_sync(0xffffffffu, sum, offset);
    if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = sum;
    __syncthreads();
    if (threadIdx.x == 0) {
      unsigned long long row_sum = 0;
      for (int w = 0; w < kThreads / 32; ++w) row_sum += partial[w];
      atomicAdd(&words->fingerprint, RowTerm(row_sum, first_token + r));
    }
    __syncthreads();  // partial is reused by the next row
  }
}

}  // namespace

absl::Status LaunchCheckRows(DType dtype, const void* rows, int64_t n, int64_t hidden_size,
                             int64_t first_token, int64_t index_base, bool fingerprint,
                             RowCheckWords* words, cudaStream_t stream, DeviceHealth* health) {
  if (n <= 0 || hidden_size <= 0) return absl::OkStatus();
  const int blocks = static_cast<int>(std::min<int64_t>(n, 16384));
  if (dtype == DType::kF32) {
    CheckRowsKernel<uint32_t><<<blocks, kThreads, 0, stream>>>(
        static_cast<const uint32_t*>(rows), n, hidden_size, first_token, index_base, 0,
        fingerprint, words);
  } else {
    CheckRowsKernel<uint16_t><<<blocks, kThreads, 0, stream>>>(
        static_cast<const uint16_t*>(rows), n, hidden_size, first_token, index_base,
        dtype == DType::kF16 ? 1 : 2, fingerprint, words);
  }
  FLCE_CUDA_RETURN_IF_ERROR(cudaGetLastError(), health);
  return absl::OkStatus();
}

}  // namespace flce::cuda
