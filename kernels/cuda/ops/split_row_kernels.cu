#include "kernels/cuda/ops/split_row_kernels.cuh"

#include "core/status_macros.h"
#include "kernels/cuda/base/policy.h"
#include "kernels/cuda/base/row_math.cuh"

namespace flce::cuda {
namespace {

using Policy = RowKernelPolicy;

template <typename T>
__device__ __forceinline__ float BiasAt(const T* bias, int64_t j) {
  return bias != nullptr ? ToFloat(bias[j]) : 0.0f;
}

template <typename T>
__global__ void __launch_bounds__(Policy::kThreads)
    SplitStatsKernel(SplitArgs args, RowState* state, bool first) {
  __shared__ RowState scratch[Policy::kThreads / 32];
  const int64_t row = blockIdx.x;
  const float* lrow = args.logits + row * args.ld;
  const T* bias = static_cast<const T*>(args.bias);
  const LossParams p = args.params;
  const RowConsts kc = MakeConsts(p);
  const int32_t y = args.target[row];
  int64_t end = args.vocab_end - args.col0;
  if (end > args.cols) end = args.cols;
  RowState st = EmptyState();
  for (int64_t c = threadIdx.x * Policy::kVec; c < end; c += Policy::kTile) {
    float4 r = *reinterpret_cast<const float4*>(lrow + c);
    const float v[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      if (c + k < end) {
        const int64_t j = args.col0 + c + k;
        PushColumn(st, TransformLogit(v[k] + BiasAt(bias, j - args.bias_col0), p, kc), static_cast<int32_t>(j), y);
      }
    }
  }
  st = BlockReduceState<Policy::kThreads>(st, scratch);
  if (threadIdx.x == 0) state[row] = first ? st : MergeStates(state[row], st);
}

__global__ void MergeStatesKernel(const RowState* parts, int count, int64_t rows,
                                  RowState* out) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (row >= rows) return;
  RowState st = parts[row];
  for (int p = 1; p < count; ++p) st = MergeStates(st, parts[p * rows + row]);
  out[row] = st;
}

__global__ void FinishRowsKernel(const RowState* state, int64_t rows, RowInputs in,
                                 RowOutputs out, LossParams params, RowGrad* grad) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (row >= rows) return;
  grad[row] = FinishRow(state[row], in, row, params, out);
}

template <typename T>
__global__ void __launch_bounds__(Policy::kThreads)
    SplitGradKernel(SplitArgs args, const RowGrad* grad) {
  const int64_t row = blockIdx.x;
  const float* lrow = args.logits + row * args.ld;
  T* drow = reinterpret_cast<T*>(const_cast<float*>(lrow));
  const T* bias = static_cast<const T*>(args.bias);
  const LossParams p = args.params;
  const RowConsts kc = MakeConsts(p);
  const RowGrad g = grad[row];
  constexpr bool kNarrow = sizeof(T) < sizeof(float);
  for (int64_t base = 0; base < args.cols; base += Policy::kTile) {
    const int64_t c = base + threadIdx.x * Policy::kVec;
    float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    const bool mine = c < args.cols;
    if (mine) {
      float4 r = *reinterpret_cast<const float4*>(lrow + c);
      const float v[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const int64_t j = args.col0 + c + k;
        if (j < args.vocab_end) {
          d[k] = ColumnGrad(TransformLogit(v[k] + BiasAt(bias, j - args.bias_col0), p, kc),
                            static_cast<int32_t>(j), g, p, kc);
        }
      }
    }
    // The narrow write of this tile overlaps fp32 bytes of this tile only
    // after every thread has read them.
    if (kNarrow) __syncthreads();
    if (mine) {
#pragma unroll
      for (int k = 0; k < 4; ++k) drow[c + k] = FromFloat<T>(d[k]);
    }
  }
}

template <typename T>
absl::Status Stats(const SplitArgs& args, RowState* state, bool first, cudaStream_t stream,
                   DeviceHealth* health) {
  if (args.rows <= 0) return absl::OkStatus();
  SplitStatsKernel<T><<<static_cast<unsigned>(args.rows), Policy::kThreads, 0, stream>>>(
      args, state, first);
  FLCE_CUDA_RETURN_IF_ERROR(cudaGetLastError(), health);
  return absl::OkStatus();
}

template <typename T>
absl::Status Grad(const SplitArgs& args, const RowGrad* grad, cudaStream_t stream,
                  DeviceHealth* health) {
  if (args.rows <= 0) return absl::OkStatus();
  SplitGradKernel<T><<<static_cast<unsigned>(args.rows), Policy::kThreads, 0, stream>>>(args,
                                                                                         grad);
  FLCE_CUDA_RETURN_IF_ERROR(cudaGetLastError(), health);
  return absl::OkStatus();
}

absl::Status CheckLayout(const SplitArgs& args) {
  if (args.ld % 4 != 0 || args.col0 % 4 != 0 || args.cols % 4 != 0 || args.cols > args.ld) {
    return absl::InternalError("split row kernel: misaligned split layout");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status LaunchSplitStats(DType dtype, const SplitArgs& args, RowState* state, bool first,
                              cudaStream_t stream, DeviceHealth* health) {
  FLCE_RETURN_IF_ERROR(CheckLayout(args));
  switch (dtype) {
    case DType::kF32: return Stats<float>(args, state, first, stream, health);
    case DType::kF16: return Stats<__half>(args, state, first, stream, health);
    case DType::kBF16: return Stats<__nv_bfloat16>(args, state, first, stream, health);
  }
  return absl::InvalidArgumentError("unknown dtype");
}

absl::Status LaunchMergeStates(const RowState* parts, int count, int64_t rows, RowState* out,
                               cudaStream_t stream, DeviceHealth* health) {
  if (rows <= 0) return absl::OkStatus();
  constexpr int kThreads = 128;
  MergeStatesKernel<<<static_cast<unsigned>((rows + kThreads - 1) / kThreads), kThreads, 0,
                      stream>>>(parts, count, rows, out);
  FLCE_CUDA_RETURN_IF_ERROR(cudaGetLastError(), health);
  return absl::OkStatus();
}

absl::Status LaunchFinishRows(const RowState* state, int64_t rows, RowInputs in, RowOutputs out,
                              const LossParams& params, RowGrad* grad, cudaStream_t stream,
                              DeviceHealth* health) {
  if (rows <= 0) return absl::OkStatus();
  constexpr int kThreads = 128;
  FinishRowsKernel<<<static_cast<unsigned>((rows + kThreads - 1) / kThreads), kThreads, 0,
                     stream>>>(state, rows, in, out, params, grad);
  FLCE_CUDA_RETURN_IF_ERROR(cudaGetLastError(), health);
  return absl::OkStatus();
}

absl::Status LaunchSplitGrad(DType dtype, const SplitArgs& args, const RowGrad* grad,
                             cudaStream_t stream, DeviceHealth* health) {
  FLCE_RETURN_IF_ERROR(CheckLayout(args));
  switch (dtype) {
    case DType::kF32: return Grad<float>(args, grad, stream, health);
    case DType::kF16: return Grad<__half>(args, grad, stream, health);
    case DType::kBF16: return Grad<__nv_bfloat16>(args, grad, stream, health);
  }
  return absl::InvalidArgumentError("unknown dtype");
}

}  // namespace flce::cuda
