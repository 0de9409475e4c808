#include "kernels/cuda/ops/fused_row_kernel.cuh"

#include "kernels/cuda/base/policy.h"
#include "kernels/cuda/base/row_math.cuh"

namespace flce::cuda {
namespace {

using Policy = RowKernelPolicy;

template <typename T>
struct Vec4Store;
template <>
struct Vec4Store<float> {
  static __device__ __forceinline__ void Store(float* dst, float a, float b, float c, float d) {
    *reinterpret_cast<float4*>(dst) = make_float4(a, b, c, d);
  }
};
template <>
struct Vec4Store<__nv_bfloat16> {
  static __device__ __forceinline__ void Store(__nv_bfloat16* dst, float a, float b, float c,
                                               float d) {
    __nv_bfloat162 lo = __floats2bfloat162_rn(a, b);
    __nv_bfloat162 hi = __floats2bfloat162_rn(c, d);
    uint2 packed;
    packed.x = *reinterpret_cast<uint32_t*>(&lo);
    packed.y = *reinterpret_cast<uint32_t*>(&hi);
    *reinterpret_cast<uint2*>(dst) = packed;
  }
};
template <>
struct Vec4Store<__half> {
  static __device__ __forceinline__ void Store(__half* dst, float a, float b, float c, float d) {
    __half2 lo = __floats2half2_rn(a, b);
    __half2 hi = __floats2half2_rn(c, d);
    uint2 packed;
    packed.x = *reinterpret_cast<uint32_t*>(&lo);
    packed.y = *reinterpret_cast<uint32_t*>(&hi);
    *reinterpret_cast<uint2*>(dst) = packed;
  }
};

template <typename T>
__device__ __forceinline__ float4 LoadZ(const float* row, const T* bias, int64_t j,
                                        const LossParams& p, const RowConsts& k) {
  float4 r = *reinterpret_cast<const float4*>(row + j);
  if (bias != nullptr) {
    r.x += ToFloat(bias[j]);
    r.y += ToFloat(bias[j + 1]);
    r.z += ToFloat(bias[j + 2]);
    r.w += ToFloat(bias[j + 3]);
  }
  r.x = TransformLogit(r.x, p, k);
  r.y = TransformLogit(r.y, p, k);
  r.z = TransformLogit(r.z, p, k);
  r.w = TransformLogit(r.w, p, k);
  return r;
}

template <typename T>
__global__ void __launch_bounds__(Policy::kThreads)
    FusedRowKernel(FusedRowArgs args) {
  __shared__ RowState scratch[Policy::kThreads / 32];
  __shared__ RowGrad row_grad;
  const int64_t row = blockIdx.x;
  const float* logits = args.logits + row * args.ld_logits;
  const T* bias = static_cast<const T*>(args.bias);
  const LossParams p = args.params;
  const RowConsts kc = MakeConsts(p);
  const int64_t vocab = p.vocab;
  const int32_t y = args.in.target[row];

  // Pass 1: online max / sum-exp over the real columns.
  RowState st = EmptyState();
  for (int64_t j = threadIdx.x * Policy::kVec; j < vocab; j += Policy::kTile) {
    float4 z = LoadZ(logits, bias, j, p, kc);
    PushColumn(st, z.x, static_cast<int32_t>(j), y);
    if (j + 1 < vocab) PushColumn(st, z.y, static_cast<int32_t>(j + 1), y);
    if (j + 2 < vocab) PushColumn(st, z.z, static_cast<int32_t>(j + 2), y);
    if (j + 3 < vocab) PushColumn(st, z.w, static_cast<int32_t>(j + 3), y);
  }
  st = BlockReduceState<Policy::kThreads>(st, scratch);
  if (threadIdx.x == 0) {
    row_grad = FinishRow(st, args.in, row, p, args.out);
  }
  __syncthreads();
  if (args.dlogits == nullptr) return;
  const RowGrad g = row_grad;

  // Pass 2: dlogits, tile by tile.
  T* drow = reinterpret_cast<T*>(static_cast<char*>(args.dlogits) + row * args.dlogits_row_bytes);
  float* prow = args.probs != nullptr ? args.probs + row * args.ld_logits : nullptr;
  const bool narrowing_in_place =
      sizeof(T) < sizeof(float) && static_cast<const void*>(drow) == static_cast<const void*>(logits);
  for (int64_t base = 0; base < args.padded_vocab; base += Policy::kTile) {
    const int64_t j = base + threadIdx.x * Policy::kVec;
    float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    float pr[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    const bool mine = j < args.padded_vocab;
    if (mine && j < vocab) {
      float4 z4 = LoadZ(logits, bias, j, p, kc);
      const float z[4] = {z4.x, z4.y, z4.z, z4.w};
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        if (j + k < vocab) {
          d[k] = ColumnGrad(z[k], static_cast<int32_t>(j + k), g, p, kc);
          if (prow != nullptr) pr[k] = expf(z[k] - g.lse);
        }
      }
    }
    // Every thread has read this tile's fp32 bytes before anyone writes the
    // narrow dlogits that overlap them.
    if (narrowing_in_place) __syncthreads();
    if (mine) {
      Vec4Store<T>::Store(drow + j, d[0], d[1], d[2], d[3]);
      if (prow != nullptr) {
        *reinterpret_cast<float4*>(prow + j) = make_float4(pr[0], pr[1], pr[2], pr[3]);
      }
    }
  }
}

template <typename T>
absl::Status Launch(const FusedRowArgs& args, cudaStream_t stream, DeviceHealth* health) {
  if (args.rows <= 0) return absl::OkStatus();
  FusedRowKernel<T><<<static_cast<unsigned>(args.rows), Policy::kThreads, 0, stream>>>(args);
  FLCE_CUDA_RETURN_IF_ERROR(cudaGetLastError(), health);
  return absl::OkStatus();
}

}  // namespace

absl::Status LaunchFusedRows(DType dtype, const FusedRowArgs& args, cudaStream_t stream,
                             DeviceHealth* health) {
  if (args.ld_logits % 4 != 0 || args.padded_vocab % 4 != 0 || args.padded_vocab < args.params.vocab) {
    return absl::InternalError("fused row kernel: misaligned logits layout");
  }
  switch (dtype) {
    case DType::kF32: return Launch<float>(args, stream, health);
    case DType::kF16: return Launch<__half>(args, stream, health);
    case DType::kBF16: return Launch<__nv_bfloat16>(args, stream, health);
  }
  return absl::InvalidArgumentError("unknown dtype");
}

}  // namespace flce::cuda
