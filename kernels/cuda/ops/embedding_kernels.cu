#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/cuda/base/row_math.cuh"
#include "kernels/cuda/ops/embedding_kernels.cuh"

namespace flce::cuda {
namespace {

constexpr int kThreads = 256;

template <typename W, typename O>
__global__ void GatherKernel(const W* weight, int64_t hidden, const int32_t* ids, int64_t n,
                             O* out) {
  const int64_t total = n * hidden;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = e / hidden, c = e - i * hidden;
    out[e] = FromFloat<O>(ToFloat(weight[static_cast<int64_t>(ids[i]) * hidden + c]));
  }
}

template <typename R>
__global__ void ScatterAtomicKernel(float* grad, int64_t hidden, const int32_t* ids, int64_t n,
                                    const R* rows) {
  const int64_t total = n * hidden;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = e / hidden, c = e - i * hidden;
    atomicAdd(grad + static_cast<int64_t>(ids[i]) * hidden + c, ToFloat(rows[e]));
  }
}

// One thread per column, rows in order: the same sums, bit for bit, every time.
template <typename R>
__global__ void ScatterOrderedKernel(float* grad, int64_t hidden, const int32_t* ids, int64_t n,
                                     const R* rows) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= hidden) return;
  for (int64_t i = 0; i < n; ++i) {
    grad[static_cast<int64_t>(ids[i]) * hidden + c] += ToFloat(rows[i * hidden + c]);
  }
}

unsigned Blocks(int64_t count) {
  const int64_t blocks = (count + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 132 * 16 ? (blocks > 0 ? blocks : 1) : 132 * 16);
}

template <typename W>
void GatherFrom(const W* weight, int64_t hidden, const int32_t* ids, int64_t n, void* out,
                DType out_dtype, cudaStream_t stream) {
  const unsigned blocks = Blocks(n * hidden);
  switch (out_dtype) {
    case DType::kF32:
      GatherKernel<<<blocks, kThreads, 0, stream>>>(weight, hidden, ids, n,
                                                    static_cast<float*>(out));
      break;
    case DType::kBF16:
      GatherKernel<<<blocks, kThreads, 0, stream>>>(weight, hidden, ids, n,
                                                    static_cast<__nv_bfloat16*>(out));
      break;
    case DType::kF16:
      GatherKernel<<<blocks, kThreads, 0, stream>>>(weight, hidden, ids, n,
                                                    static_cast<__half*>(out));
      break;
  }
}

template <typename R>
void ScatterFrom(float* grad, int64_t hidden, const int32_t* ids, int64_t n, const R* rows,
                 bool deterministic, cudaStream_t stream) {
  if (deterministic) {
    ScatterOrderedKernel<<<Blocks(hidden), kThreads, 0, stream>>>(grad, hidden, ids, n, rows);
  } else {
    ScatterAtomicKernel<<<Blocks(n * hidden), kThreads, 0, stream>>>(grad, hidden, ids, n, rows);
  }
}

}  // namespace

absl::Status LaunchGatherRows(const void* weight, DType weight_dtype, int64_t hidden,
                              const int32_t* ids, int64_t n, void* out, DType out_dtype,
                              cudaStream_t stream, DeviceHealth* health) {
  if (n <= 0) return absl::OkStatus();
  switch (weight_dtype) {
    case DType::kF32:
      GatherFrom(static_cast<const float*>(weight), hidden, ids, n, out, out_dtype, stream);
      break;
    case DType::kBF16:
      GatherFrom(static_cast<const __nv_bfloat16*>(weight), hidden, ids, n, out, out_dtype, stream);
      break;
    case DType::kF16:
      GatherFrom(static_cast<const __half*>(weight), hidden, ids, n, out, out_dtype, stream);
      break;
  }
  FLCE_CUDA_RETURN_IF_ERROR(cudaGetLastError(), health);
  return absl::OkStatus();
}

absl::Status LaunchScatterAddRows(float* grad, int64_t hidden, const int32_t* ids, int64_t n,
                                  const void* rows, DType rows_dtype, bool deterministic,
                                  cudaStream_t stream, DeviceHealth* health) {
  if (n <= 0) return absl::OkStatus();
  switch (rows_dtype) {
    case DType::kF32:
      ScatterFrom(grad, hidden, ids, n, static_cast<const float*>(rows), deterministic, stream);
      break;
    case DType::kBF16:
      ScatterFrom(grad, hidden, ids, n, static_cast<const __nv_bfloat16*>(rows), deterministic,
                  stream);
      break;
    case DType::kF16:
      ScatterFrom(grad, hidden, ids, n, static_cast<const __half*>(rows), deterministic, stream);
      break;
  }
  FLCE_CUDA_RETURN_IF_ERROR(cudaGetLastError(), health);
  return absl::OkStatus();
}

}  // namespace flce::cuda
