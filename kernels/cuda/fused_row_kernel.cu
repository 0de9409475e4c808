#include "kernels/cuda/fused_row_kernel.cuh"

#include <cstdlib>

#include "kernels/cuda/policy.h"
#include "kernels/cuda/row_math.cuh"

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
  // A capped grid walks the rows: fewer rows in flight keep a row's second
  // read in L2.
  for (int64_t row = blockIdx.x; row < args.rows; row += gridDim.x) {
  const float* logits = args.logits + row * args.ld_logits;
  const T* bias = static_cast<const T*>(args.bias);
  const LossParams p = args.params;
  const RowConsts kc = MakeConsts(p);
  const int64_t vocab = p.vocab;
  const int32_t y = args.in.target[row];

  // Pass 1: online max / sum-exp over the real columns.
  RowState st = EmptyState();
  constexpr int kU = Policy::kUnroll;
  for (int64_t base = threadIdx.x * Policy::kVec; base < vocab; base += Policy::kTile * kU) {
    float4 z4[kU];
    // Every load of the group is in flight before the first is used.
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int64_t j = base + u * Policy::kTile;
      if (j < vocab) z4[u] = LoadZ(logits, bias, j, p, kc);
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int64_t j = base + u * Policy::kTile;
      if (j < vocab) {
        const float z[4] = {z4[u].x, z4[u].y, z4[u].z, z4[u].w};
        const int count = vocab - j < 4 ? static_cast<int>(vocab - j) : 4;
        PushFour(st, z, static_cast<int32_t>(j), count, y);
      }
    }
  }
  st = BlockReduceState<Policy::kThreads>(st, scratch);
  if (threadIdx.x == 0) {
    float a = args.in.token_weight[row];
    float e = args.in.entropy_weight[row];
    row_grad = FinishRow(st, y, a, e, p, args.out, row);
  }
  __syncthreads();
  if (args.dlogits == nullptr) continue;
  const RowGrad g = row_grad;

  // Pass 2: dlogits, tile by tile.
  T* drow = reinterpret_cast<T*>(static_cast<char*>(args.dlogits) + row * args.dlogits_row_bytes);
  float* prow = args.probs != nullptr ? args.probs + row * args.ld_logits : nullptr;
  const bool narrowing_in_place =
      sizeof(T) < sizeof(float) && static_cast<const void*>(drow) == static_cast<const void*>(logits);
  for (int64_t base = 0; base < args.padded_vocab; base += Policy::kTile * kU) {
    float d[kU][4];
    float pr[kU][4];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int64_t j = base + u * Policy::kTile + threadIdx.x * Policy::kVec;
#pragma unroll
      for (int k = 0; k < 4; ++k) d[u][k] = pr[u][k] = 0.0f;
      if (j < args.padded_vocab && j < vocab) {
        float4 z4 = LoadZ(logits, bias, j, p, kc);
        const float z[4] = {z4.x, z4.y, z4.z, z4.w};
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          if (j + k < vocab) {
            d[u][k] = ColumnGrad(z[k], static_cast<int32_t>(j + k), g, p, kc);
            if (prow != nullptr) pr[u][k] = __expf(z[k] - g.lse);
          }
        }
      }
    }
    // Every thread has read this tile group's fp32 bytes before anyone
    // writes the narrow dlogits that overlap them.
    if (narrowing_in_place) __syncthreads();
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int64_t j = base + u * Policy::kTile + threadIdx.x * Policy::kVec;
      if (j < args.padded_vocab) {
        Vec4Store<T>::Store(drow + j, d[u][0], d[u][1], d[u][2], d[u][3]);
        if (prow != nullptr) {
          *reinterpret_cast<float4*>(prow + j) = make_float4(pr[u][0], pr[u][1], pr[u][2], pr[u][3]);
        }
      }
    }
  }
  }  // rows
}

// Blocks in flight: FLCE_CUDA_ROW_GRID overrides (benchmarks sweep it);
// otherwise RowKernelPolicy's choice. 0 = one block per row.
int64_t RowGridCap(int64_t padded_vocab) {
  if (const char* env = std::getenv("FLCE_CUDA_ROW_GRID"); env != nullptr && *env != '\0') {
    return std::atoll(env);
  }
  return RowKernelPolicy::GridCap(padded_vocab);
}

template <typename T>
absl::Status Launch(const FusedRowArgs& args, cudaStream_t stream, DeviceHealth* health) {
  if (args.rows <= 0) return absl::OkStatus();
  int64_t grid = args.rows;
  const int64_t cap = RowGridCap(args.padded_vocab);
  if (cap > 0 && grid > cap) grid = cap;
  FusedRowKernel<T><<<static_cast<unsigned>(grid), Policy::kThreads, 0, stream>>>(args);
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
