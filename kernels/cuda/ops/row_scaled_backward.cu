#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "core/status_macros.h"
#include "kernels/cuda/base/row_math.cuh"
#include "kernels/cuda/ops/row_scaled_backward.cuh"

namespace flce::cuda {
namespace {

constexpr int kReferenceThreads = 256;  // one warp per row
constexpr int kScaleThreads = 256;

// One warp per row, 16-byte loads (H % 8 == 0 on this path).
__global__ void __launch_bounds__(kReferenceThreads)
    RowReferenceKernel(const __nv_bfloat16* x, const __nv_bfloat16* w, const int32_t* target,
                       int64_t rows, int64_t hidden, float* reference, int32_t* fallback) {
  if (blockIdx.x == 0 && threadIdx.x == 0) *fallback = 0;
  const int64_t row =
      static_cast<int64_t>(blockIdx.x) * (kReferenceThreads / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const int32_t y = target[row];
  const uint4* xr = reinterpret_cast<const uint4*>(x + row * hidden);
  const uint4* wr =
      reinterpret_cast<const uint4*>(w + static_cast<int64_t>(y >= 0 ? y : 0) * hidden);
  float sum = 0.0f;
  for (int64_t v = lane; v < hidden / 8; v += 32) {
    const uint4 a = xr[v];
    const uint4 b = wr[v];
    const __nv_bfloat162* a2 = reinterpret_cast<const __nv_bfloat162*>(&a);
    const __nv_bfloat162* b2 = reinterpret_cast<const __nv_bfloat162*>(&b);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float2 fa = __bfloat1622float2(a2[k]);
      const float2 fb = __bfloat1622float2(b2[k]);
      sum = fmaf(fa.x, fb.x, sum);
      sum = fmaf(fa.y, fb.y, sum);
    }
  }
  sum = WarpSum(sum);
  if (lane == 0) reference[row] = sum;
}

// kVec adjacent elements as floats: one element, or eight from one or two
// 16-byte loads.
template <typename T>
__device__ __forceinline__ void Load(const T* p, float (&v)[1]) {
  v[0] = ToFloat(*p);
}
__device__ __forceinline__ void Load(const float* p, float (&v)[8]) {
  const float4 a = reinterpret_cast<const float4*>(p)[0];
  const float4 b = reinterpret_cast<const float4*>(p)[1];
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}
__device__ __forceinline__ void Load(const __nv_bfloat16* p, float (&v)[8]) {
  const uint4 raw = *reinterpret_cast<const uint4*>(p);
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float2 f = __bfloat1622float2(h[k]);
    v[2 * k] = f.x;
    v[2 * k + 1] = f.y;
  }
}
template <typename T>
__device__ __forceinline__ void Store(T* p, const float (&v)[1]) {
  *p = FromFloat<T>(v[0]);
}
__device__ __forceinline__ void Store(float* p, const float (&v)[8]) {
  reinterpret_cast<float4*>(p)[0] = make_float4(v[0], v[1], v[2], v[3]);
  reinterpret_cast<float4*>(p)[1] = make_float4(v[4], v[5], v[6], v[7]);
}
template <typename T>
__device__ __forceinline__ void Store(T* p, const float (&v)[8]) {
  T h[8];
#pragma unroll
  for (int k = 0; k < 8; ++k) h[k] = FromFloat<T>(v[k]);
  *reinterpret_cast<uint4*>(p) = *reinterpret_cast<const uint4*>(h);
}

// kVec elements of one row per step: 8 (cols % 8 == 0, 16-byte aligned
// buffers: 16-byte accesses, one row index per eight elements) or 1 (any
// layout). Either way the parts are added in their order, so that the sum is
// the same on every run and in both paths.
template <int kVec, typename In, typename Out>
__global__ void __launch_bounds__(kScaleThreads)
    ScaleRowsKernel(const In* in, Out* out, int64_t rows, int64_t cols, const float* scale,
                    const int32_t* fallback, int parts) {
  const bool unscaled = *fallback != 0;
  const int64_t n = rows * cols;
  for (int64_t i = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kVec; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x * kVec) {
    const float f = unscaled ? 1.0f : scale[i / cols];
    float v[kVec];
    Load(in + i, v);
    for (int p = 1; p < parts; ++p) {
      float w[kVec];
      Load(in + p * n + i, w);
#pragma unroll
      for (int k = 0; k < kVec; ++k) v[k] += w[k];
    }
#pragma unroll
    for (int k = 0; k < kVec; ++k) v[k] *= f;
    Store(out + i, v);
  }
}

template <int kVec, typename In, typename Out>
void LaunchScale(const In* in, Out* out, int64_t rows, int64_t cols, const float* scale,
                 const int32_t* fallback, int parts, cudaStream_t stream) {
  const int64_t threads = (rows * cols + kVec - 1) / kVec;
  const int64_t blocks = std::min<int64_t>((threads + kScaleThreads - 1) / kScaleThreads, 2048);
  const dim3 grid(static_cast<unsigned>(std::max<int64_t>(blocks, 1)));
  ScaleRowsKernel<kVec>
      <<<grid, kScaleThreads, 0, stream>>>(in, out, rows, cols, scale, fallback, parts);
}

template <typename In, typename Out>
void LaunchScale(const In* in, Out* out, int64_t rows, int64_t cols, const float* scale,
                 const int32_t* fallback, int parts, cudaStream_t stream) {
  if (cols % 8 == 0 && reinterpret_cast<uintptr_t>(in) % 16 == 0 &&
      reinterpret_cast<uintptr_t>(out) % 16 == 0) {
    LaunchScale<8>(in, out, rows, cols, scale, fallback, parts, stream);
  } else {
    LaunchScale<1>(in, out, rows, cols, scale, fallback, parts, stream);
  }
}

template <typename In>
absl::Status ScaleRowsTo(const In* in, DType out_dtype, void* out, int64_t rows, int64_t cols,
                         const float* scale, const int32_t* fallback, int parts,
                         cudaStream_t stream) {
  switch (out_dtype) {
    case DType::kF32:
      LaunchScale(in, static_cast<float*>(out), rows, cols, scale, fallback, parts, stream);
      return absl::OkStatus();
    case DType::kBF16:
      LaunchScale(in, static_cast<__nv_bfloat16*>(out), rows, cols, scale, fallback, parts, stream);
      return absl::OkStatus();
    case DType::kF16:
      LaunchScale(in, static_cast<__half*>(out), rows, cols, scale, fallback, parts, stream);
      return absl::OkStatus();
  }
  return absl::InternalError("scale rows: unknown output dtype");
}

}  // namespace

absl::Status LaunchRowReference(DType dtype, const void* x, const void* w, const int32_t* target,
                                int64_t rows, int64_t hidden, float* reference, int32_t* fallback,
                                cudaStream_t stream, DeviceHealth* health) {
  if (dtype != DType::kBF16 || hidden % 8 != 0) {
    return absl::InternalError("row reference: needs a bf16 head with H % 8 == 0");
  }
  constexpr int64_t kRowsPerBlock = kReferenceThreads / 32;
  const unsigned blocks =
      static_cast<unsigned>(std::max<int64_t>((rows + kRowsPerBlock - 1) / kRowsPerBlock, 1));
  RowReferenceKernel<<<blocks, kReferenceThreads, 0, stream>>>(
      static_cast<const __nv_bfloat16*>(x), static_cast<const __nv_bfloat16*>(w), target, rows,
      hidden, reference, fallback);
  FLCE_CUDA_RETURN_IF_ERROR(cudaGetLastError(), health);
  return absl::OkStatus();
}

absl::Status LaunchScaleRows(DType in_dtype, const void* in, DType out_dtype, void* out,
                             int64_t rows, int64_t cols, const float* scale,
                             const int32_t* fallback, cudaStream_t stream, DeviceHealth* health,
                             int parts) {
  if (rows <= 0 || cols <= 0) return absl::OkStatus();
  if (parts < 1) return absl::InternalError("scale rows: no parts");
  switch (in_dtype) {
    case DType::kF32:
      FLCE_RETURN_IF_ERROR(ScaleRowsTo(static_cast<const float*>(in), out_dtype, out, rows, cols,
                                       scale, fallback, parts, stream));
      break;
    case DType::kBF16:
      FLCE_RETURN_IF_ERROR(ScaleRowsTo(static_cast<const __nv_bfloat16*>(in), out_dtype, out, rows,
                                       cols, scale, fallback, parts, stream));
      break;
    case DType::kF16:
      return absl::InternalError("scale rows: fp16 input is not used");
  }
  FLCE_CUDA_RETURN_IF_ERROR(cudaGetLastError(), health);
  return absl::OkStatus();
}

}  // namespace flce::cuda
