#include "kernels/cuda/ops/elementwise_kernels.cuh"

#include "kernels/cuda/base/row_math.cuh"

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

// Both passes read each gradient element once (V x H fp32, ~0.7 GiB at the
// seed shape): four per thread and load, where pointers allow, so that they
// run at memory speed on a call's path. Every lane runs the same number of
// rounds so that the vote stays warp-wide.
__device__ __forceinline__ unsigned ScaleAddOne(float scale, float base, float& inout) {
  const float v = scale * inout;
  const float sum = base + v;
  inout = sum;
  return NonFiniteBit(v) | (NonFiniteBit(sum) << 1);
}

__global__ void ScaleAddCheckedKernel(float scale, const float* base, float* inout,
                                      int64_t count, bool vectors, unsigned* flags) {
  unsigned bits = 0;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t quads = vectors ? count / 4 : 0;
  const int64_t rounds = (quads + stride - 1) / stride;
  int64_t i = first;
  for (int64_t r = 0; r < rounds; ++r, i += stride) {
    if (i < quads) {
      const float4 b = reinterpret_cast<const float4*>(base)[i];
      float4 x = reinterpret_cast<float4*>(inout)[i];
      bits |= ScaleAddOne(scale, b.x, x.x) | ScaleAddOne(scale, b.y, x.y) |
              ScaleAddOne(scale, b.z, x.z) | ScaleAddOne(scale, b.w, x.w);
      reinterpret_cast<float4*>(inout)[i] = x;
    }
  }
  const int64_t rest = count - quads * 4;
  const int64_t rest_rounds = (rest + stride - 1) / stride;
  i = first;
  for (int64_t r = 0; r < rest_rounds; ++r, i += stride) {
    if (i < rest) bits |= ScaleAddOne(scale, base[quads * 4 + i], inout[quads * 4 + i]);
  }
  OrFlags(bits, flags);
}

__global__ void CheckFiniteKernel(const float* x, int64_t count, bool vectors, unsigned* flags) {
  unsigned bits = 0;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t quads = vectors ? count / 4 : 0;
  for (int64_t i = first; i < quads; i += stride) {
    const float4 v = reinterpret_cast<const float4*>(x)[i];
    bits |= NonFiniteBit(v.x) | NonFiniteBit(v.y) | NonFiniteBit(v.z) | NonFiniteBit(v.w);
  }
  for (int64_t i = quads * 4 + first; i < count; i += stride) bits |= NonFiniteBit(x[i]);
  OrFlags(bits, flags);
}

bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

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
  const bool vectors = Aligned16(base) && Aligned16(inout);
  ScaleAddCheckedKernel<<<Blocks(vectors ? (count + 3) / 4 : count), kThreads, 0, stream>>>(
      scale, base, inout, count, vectors, flags);
  FLCE_CUDA_RETURN_IF_ERROR(cudaGetLastError(), health);
  return absl::OkStatus();
}

absl::Status LaunchCheckFinite(const float* x, int64_t count, unsigned* flags,
                               cudaStream_t stream, DeviceHealth* health) {
  if (count <= 0) return absl::OkStatus();
  const bool vectors = Aligned16(x);
  CheckFiniteKernel<<<Blocks(vectors ? (count + 3) / 4 : count), kThreads, 0, stream>>>(
      x, count, vectors, flags);
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
