#include "kernels/cuda/ops/fuse_mn_kernel.cuh"

#include "kernels/cuda/base/policy.h"
#include "kernels/cuda/base/row_math.cuh"

namespace flce::cuda {
namespace {

using P = FuseMNPolicy;
constexpr int kM = P::kTileM;
constexpr int kN = P::kTileN;
constexpr int kK = P::kTileK;
constexpr int kPad = kK + 1;
static_assert(kM == 64 && kN == 64, "thread mapping assumes 64 x 64 tiles");
static_assert(2 * kPad >= kN + 1, "the operand stages hold one 64 x 65 tile in phases B/C");

template <typename T>
__device__ __forceinline__ float Load(const T* base, int64_t row, int64_t col, int64_t rows,
                                      int64_t cols, int64_t ld) {
  return (row < rows && col < cols) ? ToFloat(base[row * ld + col]) : 0.0f;
}

template <typename T>
__global__ void __launch_bounds__(P::kThreads) FuseMNKernel(FuseMNArgs args) {
  // Phase A uses a/b as the X and W stages; phases B/C reuse them as one
  // 64 x 65 operand tile.
  __shared__ float ab[2 * kM * kPad];
  __shared__ float dtile[kM][kN + 1];
  float* a = ab;
  float* b = ab + kM * kPad;
  float(*op)[kN + 1] = reinterpret_cast<float(*)[kN + 1]>(ab);

  const T* x = static_cast<const T*>(args.x);
  const T* w = static_cast<const T*>(args.w);
  const T* bias = static_cast<const T*>(args.bias);
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * kM;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kN;
  const int64_t hidden = args.hidden;
  const int tx = threadIdx.x % 16;  // 4 columns each
  const int ty = threadIdx.x / 16;  // 4 rows each
  const LossParams p = args.params;

  // Phase A: the tile's logits.
  float acc[4][4] = {};
  for (int64_t k0 = 0; k0 < hidden; k0 += kK) {
    for (int i = threadIdx.x; i < kM * kK; i += P::kThreads) {
      int r = i / kK, c = i % kK;
      a[r * kPad + c] = Load(x, m0 + r, k0 + c, args.rows, hidden, hidden);
      b[r * kPad + c] = Load(w, n0 + r, k0 + c, args.padded_vocab, hidden, hidden);
    }
    __syncthreads();
#pragma unroll 8
    for (int k = 0; k < kK; ++k) {
      float av[4], bv[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) av[i] = a[(ty * 4 + i) * kPad + k];
#pragma unroll
      for (int j = 0; j < 4; ++j) bv[j] = b[(tx * 4 + j) * kPad + k];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] += av[i] * bv[j];
    }
    __syncthreads();
  }
  // dlogits of the tile, in shared memory.
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t row = m0 + ty * 4 + i;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t col = n0 + tx * 4 + j;
      float d = 0.0f;
      if (row < args.rows && col < p.vocab) {
        float r = acc[i][j] + (bias != nullptr ? ToFloat(bias[col]) : 0.0f);
        d = ColumnGrad(TransformLogit(r, p), static_cast<int32_t>(col), args.grad[row], p);
      }
      dtile[ty * 4 + i][tx * 4 + j] = d;
    }
  }
  __syncthreads();
  if (args.grad_bias != nullptr && threadIdx.x < kN && n0 + threadIdx.x < p.vocab) {
    float s = 0.0f;
    for (int i = 0; i < kM; ++i) s += dtile[i][threadIdx.x];
    atomicAdd(args.grad_bias + n0 + threadIdx.x, s);
  }

  // Phase B: grad_input[m0:m0+64, :] += D . W[n0:n0+64, :].
  if (args.grad_input != nullptr) {
    for (int64_t h0 = 0; h0 < hidden; h0 += kN) {
      for (int i = threadIdx.x; i < kN * kN; i += P::kThreads) {
        int r = i / kN, c = i % kN;
        op[r][c] = Load(w, n0 + r, h0 + c, args.padded_vocab, hidden, hidden);
      }
      __syncthreads();
      float out[4][4] = {};
      for (int n = 0; n < kN; ++n) {
        float dv[4], wv[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) dv[i] = dtile[ty * 4 + i][n];
#pragma unroll
        for (int j = 0; j < 4; ++j) wv[j] = op[n][tx * 4 + j];
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int j = 0; j < 4; ++j) out[i][j] += dv[i] * wv[j];
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int64_t row = m0 + ty * 4 + i;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int64_t h = h0 + tx * 4 + j;
          if (row < args.rows && h < hidden) atomicAdd(args.grad_input + row * hidden + h, out[i][j]);
        }
      }
      __syncthreads();
    }
  }

  // Phase C: grad_W[n0:n0+64, :] += D^T . X[m0:m0+64, :].
  if (args.grad_weight != nullptr) {
    for (int64_t h0 = 0; h0 < hidden; h0 += kN) {
      for (int i = threadIdx.x; i < kM * kN; i += P::kThreads) {
        int r = i / kN, c = i % kN;
        op[r][c] = Load(x, m0 + r, h0 + c, args.rows, hidden, hidden);
      }
      __syncthreads();
      float out[4][4] = {};
      for (int m = 0; m < kM; ++m) {
        float dv[4], xv[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) dv[i] = dtile[m][ty * 4 + i];
#pragma unroll
        for (int j = 0; j < 4; ++j) xv[j] = op[m][tx * 4 + j];
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int j = 0; j < 4; ++j) out[i][j] += dv[i] * xv[j];
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int64_t col = n0 + ty * 4 + i;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int64_t h = h0 + tx * 4 + j;
          if (col < p.vocab && h < hidden) {
            atomicAdd(args.grad_weight + col * hidden + h, out[i][j]);
          }
        }
      }
      __syncthreads();
    }
  }
}

template <typename T>
absl::Status Launch(const FuseMNArgs& args, cudaStream_t stream, DeviceHealth* health) {
  if (args.rows <= 0) return absl::OkStatus();
  dim3 grid(static_cast<unsigned>((args.padded_vocab + kN - 1) / kN),
            static_cast<unsigned>((args.rows + kM - 1) / kM));
  if (grid.y > 65535) return absl::InternalError("fuse_mn: too many token tiles in one launch");
  FuseMNKernel<T><<<grid, P::kThreads, 0, stream>>>(args);
  FLCE_CUDA_RETURN_IF_ERROR(cudaGetLastError(), health);
  return absl::OkStatus();
}

}  // namespace

absl::Status LaunchFuseMN(DType dtype, const FuseMNArgs& args, cudaStream_t stream,
                          DeviceHealth* health) {
  switch (dtype) {
    case DType::kF32: return Launch<float>(args, stream, health);
    case DType::kF16: return Launch<__half>(args, stream, health);
    case DType::kBF16: return Launch<__nv_bfloat16>(args, stream, health);
  }
  return absl::InvalidArgumentError("unknown dtype");
}

}  // namespace flce::cuda
