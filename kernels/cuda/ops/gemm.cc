#include "kernels/cuda/ops/gemm.h"

#include <cstdlib>
#include <limits>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "kernels/cuda/ops/thin_grad_weight.cuh"

namespace flce::cuda {
namespace {

cudaDataType_t CudaType(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return CUDA_R_32F;
    case DType::kF16:
      return CUDA_R_16F;
    case DType::kBF16:
      return CUDA_R_16BF;
  }
  return CUDA_R_32F;
}

cublasComputeType_t ComputeType(DType dtype) {
  // fp32 heads use true fp32 (no TF32): their logits feed a 1e-4 loss
  // contract when the hidden side is 16-bit.
  (void)dtype;
  return CUBLAS_COMPUTE_32F;
}

absl::Status CheckDims(std::initializer_list<int64_t> dims) {
  for (int64_t d : dims) {
    if (d < 0 || d > std::numeric_limits<int>::max()) {
      return absl::InvalidArgumentError(absl::StrCat("GEMM dimension ", d, " out of range"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

LtProduct GradWeightProduct(DType dtype, int64_t ld_d, int64_t rows, int64_t cols, int64_t hidden) {
  LtProduct p;
  p.ab_type = CudaType(dtype);
  p.op_a = CUBLAS_OP_N;
  p.op_b = CUBLAS_OP_T;
  p.m = hidden;
  p.n = cols;
  p.k = rows;
  p.lda = hidden;
  p.ldb = ld_d;
  p.ldc = hidden;
  p.c_type = CUDA_R_32F;
  p.beta = 1.0f;  // accumulated onto gw
  return p;
}

Gemm::GradWeightPath Gemm::GradWeightPathFor(int64_t rows, int64_t hidden) const {
  const KernelSwitches& k = SwitchesOrDefaults(switches);
  if (UseThinGradWeight(k, rows)) return GradWeightPath::kThin;
  if (algos != nullptr && dtype != DType::kF32 &&
      PreferTileForGradWeight(rows, hidden, k.gemm_tiles.c_str())) {
    return MeasuredGemmTiles(k.gemm_tiles.c_str()) ? GradWeightPath::kMeasured
                                                   : GradWeightPath::kPreferredTile;
  }
  return GradWeightPath::kDefault;
}

const char* Gemm::GradWeightPathName(GradWeightPath path) {
  switch (path) {
    case GradWeightPath::kThin:
      return "thin_pass";
    case GradWeightPath::kPreferredTile:
      return "cublas_preferred_tile";
    case GradWeightPath::kMeasured:
      return "cublas_measured";
    case GradWeightPath::kDefault:
      break;
  }
  return "cublas";
}

absl::Status Gemm::Logits(const void* x, const void* w, int64_t rows, int64_t cols, int64_t hidden,
                          float* logits, int64_t ld) const {
  if (rows == 0 || cols == 0) return absl::OkStatus();
  FLCE_RETURN_IF_ERROR(CheckDims({rows, cols, hidden, ld}));
  const float alpha = 1.0f, beta = 0.0f;
  FLCE_CUBLAS_RETURN_IF_ERROR(cublasSetStream(handle, stream), health);
  // Column-major: logits^T (cols x rows, ld) = W_cm^T (cols x H) . X_cm (H x rows).
  FLCE_CUBLAS_RETURN_IF_ERROR(
      cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(cols), static_cast<int>(rows),
                   static_cast<int>(hidden), &alpha, w, CudaType(dtype), static_cast<int>(hidden),
                   x, CudaType(dtype), static_cast<int>(hidden), &beta, logits, CUDA_R_32F,
                   static_cast<int>(ld), ComputeType(dtype), CUBLAS_GEMM_DEFAULT),
      health);
  return absl::OkStatus();
}

absl::Status Gemm::GradInput(const void* d, int64_t ld_d, const void* w, int64_t rows, int64_t cols,
                             int64_t hidden, void* out, DType out_dtype, float beta) const {
  if (rows == 0) return absl::OkStatus();
  FLCE_RETURN_IF_ERROR(CheckDims({rows, cols, hidden, ld_d}));
  const float alpha = 1.0f;
  FLCE_CUBLAS_RETURN_IF_ERROR(cublasSetStream(handle, stream), health);
  // Column-major: out^T (H x rows) = W_cm (H x cols) . D_cm (cols x rows).
  FLCE_CUBLAS_RETURN_IF_ERROR(
      cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(hidden),
                   static_cast<int>(rows), static_cast<int>(cols), &alpha, w, CudaType(dtype),
                   static_cast<int>(hidden), d, CudaType(dtype), static_cast<int>(ld_d), &beta, out,
                   CudaType(out_dtype), static_cast<int>(hidden), ComputeType(dtype),
                   CUBLAS_GEMM_DEFAULT),
      health);
  return absl::OkStatus();
}

absl::Status Gemm::GradWeight(const void* d, int64_t ld_d, const void* x, int64_t rows,
                              int64_t cols, int64_t hidden, float* gw) const {
  if (rows == 0 || cols == 0) return absl::OkStatus();
  FLCE_RETURN_IF_ERROR(CheckDims({rows, cols, hidden, ld_d}));
  const GradWeightPath path = GradWeightPathFor(rows, hidden);
  if (path == GradWeightPath::kThin) {
    return LaunchThinGradWeight(dtype, d, ld_d, x, rows, cols, hidden, gw, stream, health);
  }
  const float alpha = 1.0f, beta = 1.0f;
  // Column-major: gw^T (H x cols) += X_cm (H x rows) . (D_cm (cols x rows))^T.
  if (path == GradWeightPath::kPreferredTile || path == GradWeightPath::kMeasured) {
    const LtProduct p = GradWeightProduct(dtype, ld_d, rows, cols, hidden);
    FLCE_ASSIGN_OR_RETURN(
        const bool ran,
        algos->Run(p, SwitchesOrDefaults(switches).gemm_tiles, x, d, gw, stream, health));
    if (ran) return absl::OkStatus();
  }
  FLCE_CUBLAS_RETURN_IF_ERROR(cublasSetStream(handle, stream), health);
  FLCE_CUBLAS_RETURN_IF_ERROR(
      cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_T, static_cast<int>(hidden),
                   static_cast<int>(cols), static_cast<int>(rows), &alpha, x, CudaType(dtype),
                   static_cast<int>(hidden), d, CudaType(dtype), static_cast<int>(ld_d), &beta, gw,
                   CUDA_R_32F, static_cast<int>(hidden), ComputeType(dtype), CUBLAS_GEMM_DEFAULT),
      health);
  return absl::OkStatus();
}

absl::Status Gemm::GradBias(const void* d, int64_t ld_d, const void* ones, int64_t rows,
                            int64_t cols, float* gb) const {
  if (rows == 0 || cols == 0) return absl::OkStatus();
  FLCE_RETURN_IF_ERROR(CheckDims({rows, cols, ld_d}));
  const float alpha = 1.0f, beta = 1.0f;
  FLCE_CUBLAS_RETURN_IF_ERROR(cublasSetStream(handle, stream), health);
  // Column-major: gb (cols x 1) += D_cm (cols x rows) . ones (rows x 1).
  FLCE_CUBLAS_RETURN_IF_ERROR(
      cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(cols), 1,
                   static_cast<int>(rows), &alpha, d, CudaType(dtype), static_cast<int>(ld_d), ones,
                   CudaType(dtype), static_cast<int>(rows), &beta, gb, CUDA_R_32F,
                   static_cast<int>(cols), ComputeType(dtype), CUBLAS_GEMM_DEFAULT),
      health);
  return absl::OkStatus();
}

}  // namespace flce::cuda
