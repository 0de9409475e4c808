#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <limits>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "kernels/cuda/base/row_math.cuh"
#include "kernels/cuda/ops/thin_grad_weight.cuh"

namespace flce::cuda {
namespace {

constexpr int kThreads = 256;

// kVec adjacent elements (of x, or of the fp32 accumulator) as floats.
template <typename T>
__device__ __forceinline__ void LoadFloats(const T* p, float (&v)[1]) {
  v[0] = ToFloat(*p);
}
__device__ __forceinline__ void LoadFloats(const float* p, float (&v)[4]) {
  const float4 a = *reinterpret_cast<const float4*>(p);
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
}
template <typename T>
__device__ __forceinline__ void LoadFloats(const T* p, float (&v)[4]) {
  // 16-bit types: four elements in one 8-byte load.
  const uint2 raw = *reinterpret_cast<const uint2*>(p);
  const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) v[i] = ToFloat(e[i]);
}

// One thread per kVec adjacent accumulator entries of one vocabulary row.
// `groups` = hidden / kVec; the flat index fits 32 bits (checked at launch).
template <typename T, int kVec>
__global__ void __launch_bounds__(kThreads)
    ThinGradWeightKernel(const T* __restrict__ d, int64_t ld_d, const T* __restrict__ x, int rows,
                         uint32_t cols, uint32_t groups, int64_t hidden, float* __restrict__ gw) {
  const uint32_t i = blockIdx.x * kThreads + threadIdx.x;
  if (i >= cols * groups) return;
  const uint32_t v = i / groups;
  const int64_t k = static_cast<int64_t>(i - v * groups) * kVec;
  float* out = gw + static_cast<int64_t>(v) * hidden + k;
  float acc[kVec];
  LoadFloats(out, acc);
  for (int t = 0; t < rows; ++t) {
    const float e = ToFloat(d[t * ld_d + v]);
    float xv[kVec];
    LoadFloats(x + t * hidden + k, xv);
#pragma unroll
    for (int j = 0; j < kVec; ++j) acc[j] = fmaf(e, xv[j], acc[j]);
  }
  if constexpr (kVec == 4) {
    *reinterpret_cast<float4*>(out) = make_float4(acc[0], acc[1], acc[2], acc[3]);
  } else {
    *out = acc[0];
  }
}

template <typename T>
void Launch(const T* d, int64_t ld_d, const T* x, int rows, int64_t cols, int64_t hidden, float* gw,
            cudaStream_t stream) {
  const bool vec = hidden % 4 == 0 && reinterpret_cast<uintptr_t>(gw) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(x) % (4 * sizeof(T)) == 0;
  const int64_t groups = vec ? hidden / 4 : hidden;
  const unsigned blocks = static_cast<unsigned>((cols * groups + kThreads - 1) / kThreads);
  if (vec) {
    ThinGradWeightKernel<T, 4><<<blocks, kThreads, 0, stream>>>(
        d, ld_d, x, rows, static_cast<uint32_t>(cols), static_cast<uint32_t>(groups), hidden, gw);
  } else {
    ThinGradWeightKernel<T, 1><<<blocks, kThreads, 0, stream>>>(
        d, ld_d, x, rows, static_cast<uint32_t>(cols), static_cast<uint32_t>(groups), hidden, gw);
  }
}

}  // namespace

absl::Status LaunchThinGradWeight(DType dtype, const void* d, int64_t ld_d, const void* x,
                                  int64_t rows, int64_t cols, int64_t hidden, float* gw,
                                  cudaStream_t stream, DeviceHealth* health) {
  if (rows == 0 || cols == 0 || hidden == 0) return absl::OkStatus();
  if (rows < 0 || rows > kThinGradWeightRows || cols < 0 || hidden < 0 ||
      cols * hidden > std::numeric_limits<uint32_t>::max() - kThreads) {
    return absl::InternalError(absl::StrCat("thin grad_W: ", rows, " x ", cols, " x ", hidden,
                                            " is outside the streaming pass's range"));
  }
  const int r = static_cast<int>(rows);
  switch (dtype) {
    case DType::kF32:
      Launch(static_cast<const float*>(d), ld_d, static_cast<const float*>(x), r, cols, hidden, gw,
             stream);
      break;
    case DType::kF16:
      Launch(static_cast<const __half*>(d), ld_d, static_cast<const __half*>(x), r, cols, hidden,
             gw, stream);
      break;
    case DType::kBF16:
      Launch(static_cast<const __nv_bfloat16*>(d), ld_d, static_cast<const __nv_bfloat16*>(x), r,
             cols, hidden, gw, stream);
      break;
  }
  FLCE_CUDA_RETURN_IF_ERROR(cudaGetLastError(), health);
  return absl::OkStatus();
}

}  // namespace flce::cuda
