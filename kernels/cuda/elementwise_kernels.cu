#include "kernels/cuda/elementwise_kernels.cuh"

#include "kernels/cuda/row_math.cuh"

namespace flce::cuda {
namespace {

constexpr int kThreads = 256;

unsigned Blocks(int64_t count) {
  int64_t blocks = (count + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 65536 * 16 ? blocks : 65536 * 16);
}

template <typename S, typename D>
__global__ void ConvertKernel(const S* src, D* dst, int64_t count) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    dst[i] = FromFloat<D>(ToFloat(src[i]));
  }
}

__global__ void AxpyKernel(float alpha, const float* x, float* y, int64_t count) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    y[i] += alpha * x[i];
  }
}

template <typename D>
__global__ void FillOnesKernel(D* dst, int64_t count) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    dst[i] = FromFloat<D>(1.0f);
  }
}

__global__ void FaultKernel(int* target) { *target = 1; }

template <typename S>
absl::Status ConvertFrom(const S* src, DType dst_dtype, void* dst, int64_t count,
                         cudaStream_t stream) {
  switch (dst_dtype) {
    case DType::kF32:
      ConvertKernel<<<Blocks(count), kThreads, 0, stream>>>(src, static_cast<float*>(dst), count);
      return absl::OkStatus();
    case DType::kF16:
      ConvertKernel<<<Blocks(count), kThreads, 0, stream>>>(src, static_cast<__half*>(dst), count);
      return absl::OkStatus();
    case DType::kBF16:
      ConvertKernel<<<Blocks(count), kThreads, 0, stream>>>(
          src, static_cast<__nv_bfloat16*>(dst), count);
      return absl::OkStatus();
  }
  return absl::InvalidArgumentError("unknown dtype");
}

}  // namespace

absl::Status LaunchConvert(DType src_dtype, const void* src, DType dst_dtype, void* dst,
                           int64_t count, cudaStream_t stream, DeviceHealth* health) {
  if (count <= 0) return absl::OkStatus();
  const absl::Status st =
      src_dtype == DType::kF32
          ? ConvertFrom(static_cast<const float*>(src), dst_dtype, dst, count, stream)
      : src_dtype == DType::kF16
          ? ConvertFrom(static_cast<const __half*>(src), dst_dtype, dst, count, stream)
          : ConvertFrom(static_cast<const __nv_bfloat16*>(src), dst_dtype, dst, count, stream);
  if (!st.ok()) return st;
  FLCE_CUDA_RETURN_IF_ERROR(cudaGetLastError(), health);
  return absl::OkStatus();
}

absl::Status LaunchFillOnes(DType dtype, void* dst, int64_t count, cudaStream_t stream,
                            DeviceHealth* health) {
  if (count <= 0) return absl::OkStatus();
  switch (dtype) {
    case DType::kF32:
      FillOnesKernel<<<Blocks(count), kThreads, 0, stream>>>(static_cast<float*>(dst), count);
      break;
    case DType::kF16:
      FillOnesKernel<<<Blocks(count), kThreads, 0, stream>>>(static_cast<__half*>(dst), count);
      break;
    case DType::kBF16:
      FillOnesKernel<<<Blocks(count), kThreads, 0, stream>>>(static_cast<__nv_bfloat16*>(dst),
                                                             count);
      break;
  }
  FLCE_CUDA_RETURN_IF_ERROR(cudaGetLastError(), health);
  return absl::OkStatus();
}

absl::Status LaunchAxpy(float alpha, const float* x, float* y, int64_t count,
                        cudaStream_t stream, DeviceHealth* health) {
  if (count <= 0) return absl::OkStatus();
  AxpyKernel<<<Blocks(count), kThreads, 0, stream>>>(alpha, x, y, count);
  FLCE_CUDA_RETURN_IF_ERROR(cudaGetLastError(), health);
  return absl::OkStatus();
}

absl::Status LaunchDeviceFault(cudaStream_t stream, DeviceHealth* health) {
  // An address in no allocation: the write raises cudaErrorIllegalAddress.
  FaultKernel<<<1, 1, 0, stream>>>(reinterpret_cast<int*>(uintptr_t{0x10}));
  FLCE_CUDA_RETURN_IF_ERROR(cudaGetLastError(), health);
  FLCE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream), health);
  return absl::OkStatus();
}

}  // namespace flce::cuda
