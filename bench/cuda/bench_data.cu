#include <cuda_bf16.h>

#include "bench/cuda/bench_data.cuh"

namespace flce::bench {
namespace {

__device__ __forceinline__ uint64_t Mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}

__device__ __forceinline__ float Uniform(uint64_t bits) {
  return (static_cast<float>(bits >> 40) + 0.5f) * (1.0f / 16777216.0f);
}

__global__ void NormalKernel(__nv_bfloat16* dst, int64_t count, float stddev, uint64_t seed) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    uint64_t a = Mix(seed ^ (2 * i + 1) * 0x9e3779b97f4a7c15ULL);
    uint64_t b = Mix(a + 0x632be59bd9b4e019ULL);
    float r = sqrtf(-2.0f * logf(Uniform(a)));
    dst[i] = __float2bfloat16_rn(stddev * r * cospif(2.0f * Uniform(b)));
  }
}

__global__ void NormalF32Kernel(float* dst, int64_t count, float stddev, uint64_t seed) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    uint64_t a = Mix(seed ^ (2 * i + 1) * 0x9e3779b97f4a7c15ULL);
    uint64_t b = Mix(a + 0x632be59bd9b4e019ULL);
    float r = sqrtf(-2.0f * logf(Uniform(a)));
    dst[i] = stddev * r * cospif(2.0f * Uniform(b));
  }
}

__global__ void TargetsKernel(int32_t* dst, int64_t count, int64_t vocab, float ignored,
                              uint64_t seed) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    uint64_t a = Mix(seed ^ (i + 7) * 0xd1b54a32d192ed03ULL);
    dst[i] = Uniform(Mix(a)) < ignored ? -1 : static_cast<int32_t>(a % vocab);
  }
}

__global__ void ConstantKernel(float* dst, int64_t count, float value) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    dst[i] = value;
  }
}

__global__ void WeightsKernel(float* dst, const int32_t* target, int64_t count, float value) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    dst[i] = target[i] >= 0 ? value : 0.0f;
  }
}

constexpr int kThreads = 256;
constexpr int kBlocks = 132 * 16;

}  // namespace

cudaError_t FillNormalF32(float* dst, int64_t count, float stddev, uint64_t seed,
                          cudaStream_t stream) {
  NormalF32Kernel<<<kBlocks, kThreads, 0, stream>>>(dst, count, stddev, seed);
  return cudaGetLastError();
}

cudaError_t FillNormalBf16(void* dst, int64_t count, float stddev, uint64_t seed,
                           cudaStream_t stream) {
  NormalKernel<<<kBlocks, kThreads, 0, stream>>>(static_cast<__nv_bfloat16*>(dst), count, stddev,
                                                 seed);
  return cudaGetLastError();
}

cudaError_t FillTargets(int32_t* dst, int64_t count, int64_t vocab, float ignored, uint64_t seed,
                        cudaStream_t stream) {
  TargetsKernel<<<kBlocks, kThreads, 0, stream>>>(dst, count, vocab, ignored, seed);
  return cudaGetLastError();
}

cudaError_t FillConstant(float* dst, int64_t count, float value, cudaStream_t stream) {
  ConstantKernel<<<kBlocks, kThreads, 0, stream>>>(dst, count, value);
  return cudaGetLastError();
}

cudaError_t FillTokenWeights(float* dst, const int32_t* target, int64_t count, float value,
                             cudaStream_t stream) {
  WeightsKernel<<<kBlocks, kThreads, 0, stream>>>(dst, target, count, value);
  return cudaGetLastError();
}

}  // namespace flce::bench
