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

__device__ __forceinline__ unsigned NonFiniteBit(float x) {
  return (__float_as_uint(x) & 0x7f800000u) == 0x7f800000u;
}

// Flags are rare: a warp votes and one lane writes, so the common all-finite
// pass costs no atomics.
__device__ __forceinline__ void OrFlags(unsigned bits, unsigned* flags) {
  const unsigned any = __reduce_or_sync(0xffffffffu, bits);
  if (any != 0 && (threadIdx.x & 31) == 0) atomicOr(flags, any);
}

__global__ void ScaleAddCheckedKernel(float scale, const float* base, float* inout,
                                      int64_t count, unsigned* flags) {
  unsigned bits = 0;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  // Every lane runs the same number of iterations so the vote is warp-wide.
  const int64_t rounds = (count + stride - 1) / stride;
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t r = 0; r < rounds; ++r, i += stride) {
    if (i < count) {
      const float v = scale * inout[i];
      const float sum = base[i] + v;
      inout[i] = sum;
      bits |= NonFiniteBit(v) | (NonFiniteBit(sum) << 1);
    }
  }
  OrFlags(bits, flags);
}

__global__ void CheckFiniteKernel(const float* x, int64_t count, unsigned* flags) {
  unsigned bits = 0;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    bits |= NonFiniteBit(x[i]);
  }
  OrFlags(bits, flags);
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

absl::Status LaunchScaleAddChecked(float scale, const float* base, float* inout, int64_t count,
                                   unsigned* flags, cudaStream_t stream, DeviceHealth* health) {
  if (count <= 0) return absl::OkStatus();
  ScaleAddCheckedKernel<<<Blocks(count), kThreads, 0, stream>>>(scale, base, inout, count, flags);
  FLCE_CUDA_RETURN_IF_ERROR(cudaGetLastError(), health);
  return absl::OkStatus();
}

absl::Status LaunchCheckFinite(const float* x, int64_t count, unsigned* flags,
                               cudaStream_t stream, DeviceHealth* health) {
  if (count <= 0) return absl::OkStatus();
  CheckFiniteKernel<<<Blocks(count), kThreads, 0, stream>>>(x, count, flags);
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
