// The plans' three GEMMs (and the bias column sum) through cuBLAS, in
// row-major terms; grad_W for chunks of a few rows streams the accumulator
// instead (thin_grad_weight.cuh). Operands are in the head's dtype (bf16/fp16 with fp32
// accumulation; fp32 heads use plain fp32 GEMMs, no TF32).
// cuBLAS is deterministic for a fixed configuration: no split-K atomics are
// enabled.
#ifndef FLCE_KERNELS_CUDA_OPS_GEMM_H_
#define FLCE_KERNELS_CUDA_OPS_GEMM_H_

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "core/dtype.h"
#include "kernels/cuda/base/cuda_status.h"
#include "kernels/cuda/base/kernel_choices.h"
#include "kernels/cuda/ops/gemm_algos.h"

namespace flce::cuda {

// grad_W's product gw^T (H x cols, fp32) += X_cm (H x rows) . D_cm (cols x rows)^T
// in cublasLt's column-major terms, as Gemm::GradWeight runs it on a preferred tile.
LtProduct GradWeightProduct(DType dtype, int64_t ld_d, int64_t rows, int64_t cols, int64_t hidden);

struct Gemm {
  cublasHandle_t handle = nullptr;
  cudaStream_t stream = nullptr;
  DeviceHealth* health = nullptr;
  DType dtype = DType::kBF16;  // of W, X and dlogits
  // Optional: grad_W of the chunks PreferTileForGradWeight names runs on
  // cuBLAS's algorithm of a preferred tile where it has one (gemm_algos.h);
  // without it, and for the other products, cublasGemmEx's default (on the
  // preferred tiles grad_input is slower in whole runs: docs/perf/cuda.md).
  GemmAlgos* algos = nullptr;
  // The plan's switches (kernel_choices.h): which grad_W products take the
  // streaming pass or a preferred tile. Null: the defaults.
  const KernelSwitches* switches = nullptr;

  // logits[rows x cols] (fp32, row stride ld) = X[rows x H] . W[cols x H]^T
  absl::Status Logits(const void* x, const void* w, int64_t rows, int64_t cols, int64_t hidden,
                      float* logits, int64_t ld) const;
  // out[rows x H] = beta * out + D[rows x cols] . W[cols x H]; D's row stride
  // ld_d elements of dtype; out in out_dtype (dtype or fp32).
  absl::Status GradInput(const void* d, int64_t ld_d, const void* w, int64_t rows, int64_t cols,
                         int64_t hidden, void* out, DType out_dtype, float beta) const;
  // gw[cols x H] (fp32) += D[rows x cols]^T . X[rows x H], by the path
  // GradWeightPathFor names.
  absl::Status GradWeight(const void* d, int64_t ld_d, const void* x, int64_t rows, int64_t cols,
                          int64_t hidden, float* gw) const;
  // gb[cols] (fp32) += column sums of D, via D^T . ones.
  absl::Status GradBias(const void* d, int64_t ld_d, const void* ones, int64_t rows, int64_t cols,
                        float* gb) const;

  // grad_W of `rows` tokens: the streaming pass (thin_grad_weight.cuh),
  // cublasLt asked for a preferred tile (cublasGemmEx where none is offered),
  // cublasLt's algorithm measured fastest (MeasuredGemmTiles), or cublasGemmEx.
  enum class GradWeightPath { kThin, kPreferredTile, kMeasured, kDefault };
  GradWeightPath GradWeightPathFor(int64_t rows, int64_t hidden) const;
  static const char* GradWeightPathName(GradWeightPath path);
};

}  // namespace flce::cuda

#endif  // FLCE_KERNELS_CUDA_OPS_GEMM_H_
