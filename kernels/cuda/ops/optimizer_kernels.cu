#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "kernels/cuda/base/row_math.cuh"
#include "kernels/cuda/ops/optimizer_kernels.cuh"

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

// Four 16-bit values in one 8-byte store.
template <typename Served>
__device__ __forceinline__ void StoreServed4(void* served, int64_t q, const float (&p)[kVec]) {
  union {
    Served v[kVec];
    uint2 bits;
  } packed;
#pragma unroll
  for (int k = 0; k < kVec; ++k) packed.v[k] = FromFloat<Served>(p[k]);
  reinterpret_cast<uint2*>(served)[q] = packed.bits;
}

// Elements [4q, 4q + 4): one float4 of each array. Every index is a constant,
// so the arrays stay in registers.
template <OptimizerKind kKind, bool kApply, typename Served>
__device__ __forceinline__ unsigned StepFour(const ElementStep& s, const OptimizerArrays& a,
                                             int64_t q) {
  float g[kVec], p[kVec], m[kVec] = {}, v[kVec] = {}, vmax[kVec] = {};
  Load4(a.grad, q, g);
  Load4(a.params, q, p);
  if (a.m) Load4(a.m, q, m);
  if (a.v) Load4(a.v, q, v);
  if (a.vmax) Load4(a.vmax, q, vmax);
  unsigned bits = 0;
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    ElementState e{p[k], m[k], v[k], vmax[k]};
    bits |= StepElement<kKind>(s, g[k], e);
    p[k] = e.param;
    m[k] = e.m;
    v[k] = e.v;
    vmax[k] = e.vmax;
  }
  if constexpr (kApply) {
    Store4(a.params, q, p);
    if (a.m) Store4(a.m, q, m);
    if (a.v) Store4(a.v, q, v);
    if (a.vmax) Store4(a.vmax, q, vmax);
    if constexpr (!std::is_same_v<Served, float>) StoreServed4<Served>(a.served, q, p);
  }
  return bits;
}

// One element of the tail that does not fill a float4.
template <OptimizerKind kKind, bool kApply, typename Served>
__device__ __forceinline__ unsigned StepOne(const ElementStep& s, const OptimizerArrays& a,
                                            int64_t i) {
  ElementState e{a.params[i], a.m ? a.m[i] : 0.0f, a.v ? a.v[i] : 0.0f, a.vmax ? a.vmax[i] : 0.0f};
  const unsigned bits = StepElement<kKind>(s, a.grad[i], e);
  if constexpr (kApply) {
    a.params[i] = e.param;
    if (a.m) a.m[i] = e.m;
    if (a.v) a.v[i] = e.v;
    if (a.vmax) a.vmax[i] = e.vmax;
    if constexpr (!std::is_same_v<Served, float>) {
      static_cast<Served*>(a.served)[i] = FromFloat<Served>(e.param);
    }
  }
  return bits;
}

template <OptimizerKind kKind, bool kApply, typename Served>
__global__ void OptimizerKernel(ElementStep s, OptimizerArrays a, unsigned* flags) {
  const int64_t groups = a.count / kVec;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t thread = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  unsigned bits = 0;
  for (int64_t q = thread; q < groups; q += stride) {
    bits |= StepFour<kKind, kApply, Served>(s, a, q);
  }
  if (thread < a.count - groups * kVec) {
    bits |= StepOne<kKind, kApply, Served>(s, a, groups * kVec + thread);
  }
  if constexpr (!kApply) {
    // Every lane reaches the vote, whatever its share of the work.
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
