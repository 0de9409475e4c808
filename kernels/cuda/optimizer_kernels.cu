#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "kernels/cuda/optimizer_kernels.cuh"
#include "kernels/cuda/row_math.cuh"

namespace flce::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kVec = 4;  // elements per thread and iteration: one float4 of each array

unsigned Blocks(int64_t items) {
  int64_t blocks = (items + kThreads - 1) / kThreads;
  if (blocks < 1) blocks = 1;
  return static_cast<unsigned>(blocks < 132 * 32 ? blocks : 132 * 32);
}

__device__ __forceinline__ void Load4(const float* p, int64_t i, float (&out)[kVec]) {
  const float4 v = reinterpret_cast<const float4*>(p)[i];
  out[0] = v.x;
  out[1] = v.y;
  out[2] = v.z;
  out[3] = v.w;
}

__device__ __forceinline__ void Store4(float* p, int64_t i, const float (&in)[kVec]) {
  reinterpret_cast<float4*>(p)[i] = make_float4(in[0], in[1], in[2], in[3]);
}

// Elements [first, first + n) of the group, n <= kVec; vectorised when n == kVec.
template <OptimizerKind kKind, bool kApply, typename Served>
__device__ __forceinline__ unsigned StepElements(const ElementStep& s, const OptimizerArrays& a,
                                                 int64_t first, int n, bool vector) {
  float g[kVec] = {}, p[kVec] = {}, m[kVec] = {}, v[kVec] = {}, vmax[kVec] = {};
  if (vector) {
    const int64_t q = first / kVec;
    Load4(a.grad, q, g);
    Load4(a.params, q, p);
    if (a.m) Load4(a.m, q, m);
    if (a.v) Load4(a.v, q, v);
    if (a.vmax) Load4(a.vmax, q, vmax);
  } else {
    for (int k = 0; k < n; ++k) {
      g[k] = a.grad[first + k];
      p[k] = a.params[first + k];
      if (a.m) m[k] = a.m[first + k];
      if (a.v) v[k] = a.v[first + k];
      if (a.vmax) vmax[k] = a.vmax[first + k];
    }
  }
  unsigned bits = 0;
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    if (k >= n) break;
    ElementState e{p[k], m[k], v[k], vmax[k]};
    bits |= StepElement<kKind>(s, g[k], e);
    p[k] = e.param;
    m[k] = e.m;
    v[k] = e.v;
    vmax[k] = e.vmax;
  }
  if constexpr (kApply) {
    if (vector) {
      const int64_t q = first / kVec;
      Store4(a.params, q, p);
      if (a.m) Store4(a.m, q, m);
      if (a.v) Store4(a.v, q, v);
      if (a.vmax) Store4(a.vmax, q, vmax);
    } else {
      for (int k = 0; k < n; ++k) {
        a.params[first + k] = p[k];
        if (a.m) a.m[first + k] = m[k];
        if (a.v) a.v[first + k] = v[k];
        if (a.vmax) a.vmax[first + k] = vmax[k];
      }
    }
    if constexpr (!std::is_same_v<Served, float>) {
      Served* served = static_cast<Served*>(a.served);
      for (int k = 0; k < n; ++k) served[first + k] = FromFloat<Served>(p[k]);
    }
  }
  return bits;
}

template <OptimizerKind kKind, bool kApply, typename Served>
__global__ void OptimizerKernel(ElementStep s, OptimizerArrays a, unsigned* flags) {
  const int64_t groups = (a.count + kVec - 1) / kVec;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  // Every lane runs the same number of rounds so the check's vote is warp-wide.
  const int64_t rounds = (groups + stride - 1) / stride;
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  unsigned bits = 0;
  for (int64_t r = 0; r < rounds; ++r, i += stride) {
    if (i < groups) {
      const int64_t first = i * kVec;
      const int n = static_cast<int>(a.count - first < kVec ? a.count - first : kVec);
      bits |= StepElements<kKind, kApply, Served>(s, a, first, n, n == kVec);
    }
  }
  if constexpr (!kApply) {
    const unsigned any = __reduce_or_sync(0xffffffffu, bits);
    if (any != 0 && (threadIdx.x & 31) == 0) atomicOr(flags, any);
  }
}

template <bool kApply, typename Served>
absl::Status LaunchFor(OptimizerKind kind, const ElementStep& s, const OptimizerArrays& a,
                       unsigned* flags, cudaStream_t stream, DeviceHealth* health) {
  if (a.count <= 0) return absl::OkStatus();
  const unsigned blocks = Blocks((a.count + kVec - 1) / kVec);
  if (kind == OptimizerKind::kSgd) {
    OptimizerKernel<OptimizerKind::kSgd, kApply, Served>
        <<<blocks, kThreads, 0, stream>>>(s, a, flags);
  } else {
    OptimizerKernel<OptimizerKind::kAdamW, kApply, Served>
        <<<blocks, kThreads, 0, stream>>>(s, a, flags);
  }
  FLCE_CUDA_RETURN_IF_ERROR(cudaGetLastError(), health);
  return absl::OkStatus();
}

__global__ void SumOfSquaresPartials(const float* x, int64_t count, double* partials) {
  __shared__ double warp_sums[kThreads / 32];
  double sum = 0.0;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const double v = x[i];
    sum += v * v;
  }
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_down_sync(0xffffffffu, sum, offset);
  if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x / 32] = sum;
  __syncthreads();
  if (threadIdx.x == 0) {
    double block = 0.0;
    for (int w = 0; w < kThreads / 32; ++w) block += warp_sums[w];
    partials[blockIdx.x] = block;
  }
}

__global__ void SumPartials(const double* partials, int n, double* out) {
  double sum = 0.0;
  for (int i = 0; i < n; ++i) sum += partials[i];
  *out = sum;
}

}  // namespace

absl::Status LaunchOptimizerCheck(OptimizerKind kind, const ElementStep& step,
                                  const OptimizerArrays& arrays, unsigned* flags,
                                  cudaStream_t stream, DeviceHealth* health) {
  // The check reads the served weight's dtype only through step.finite_limit.
  return LaunchFor<false, float>(kind, step, arrays, flags, stream, health);
}

absl::Status LaunchOptimizerApply(OptimizerKind kind, const ElementStep& step,
                                  const OptimizerArrays& arrays, cudaStream_t stream,
                                  DeviceHealth* health) {
  if (arrays.served == nullptr) {
    return LaunchFor<true, float>(kind, step, arrays, nullptr, stream, health);
  }
  switch (arrays.served_dtype) {
    case DType::kBF16:
      return LaunchFor<true, __nv_bfloat16>(kind, step, arrays, nullptr, stream, health);
    case DType::kF16:
      return LaunchFor<true, __half>(kind, step, arrays, nullptr, stream, health);
    case DType::kF32:
      break;
  }
  return absl::InternalError("an fp32 head's weight is its own master: nothing is served apart");
}

absl::Status LaunchSumOfSquares(const float* x, int64_t count, double* partials, double* out,
                                cudaStream_t stream, DeviceHealth* health) {
  // A fixed grid and a fixed combination order: bitwise-repeatable.
  SumOfSquaresPartials<<<kSumOfSquaresBlocks, kThreads, 0, stream>>>(x, count, partials);
  FLCE_CUDA_RETURN_IF_ERROR(cudaGetLastError(), health);
  SumPartials<<<1, 1, 0, stream>>>(partials, kSumOfSquaresBlocks, out);
  FLCE_CUDA_RETURN_IF_ERROR(cudaGetLastError(), health);
  return absl::OkStatus();
}

}  // namespace flce::cuda
