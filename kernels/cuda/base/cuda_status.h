// CUDA and cuBLAS return codes as absl::Status, and the engine's health flag.
// Allocation failures become RESOURCE_EXHAUSTED, errors that corrupt the
// context (illegal address, launch failure, ...) mark the device unhealthy and
// every later call fails with UNAVAILABLE; anything else is INTERNAL.
#ifndef FLCE_KERNELS_CUDA_BASE_CUDA_STATUS_H_
#define FLCE_KERNELS_CUDA_BASE_CUDA_STATUS_H_

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <atomic>
#include <memory>

#include "absl/status/status.h"

namespace flce::cuda {

// Shared by the engine and every object it hands out.
struct DeviceHealth {
  std::atomic<bool> healthy{true};
  // UNAVAILABLE once unhealthy, else OK.
  absl::Status Check() const;
};

// True for errors after which the CUDA context cannot be used again.
bool IsStickyError(cudaError_t error);

absl::Status CudaStatus(cudaError_t error, const char* what, DeviceHealth* health);
absl::Status CublasStatus(cublasStatus_t status, const char* what, DeviceHealth* health);

}  // namespace flce::cuda

// Evaluates a cudaError_t expression; returns a Status from the enclosing
// function when it failed. `health` must be a DeviceHealth* in scope.
#define FLCE_CUDA_RETURN_IF_ERROR(expr, health)                                         \
  do {                                                                                  \
    cudaError_t flce_cuda_err_ = (expr);                                                \
    if (flce_cuda_err_ != cudaSuccess)                                                  \
      return ::flce::cuda::CudaStatus(flce_cuda_err_, #expr, (health));                 \
  } while (0)

#define FLCE_CUBLAS_RETURN_IF_ERROR(expr, health)                                       \
  do {                                                                                  \
    cublasStatus_t flce_cublas_st_ = (expr);                                            \
    if (flce_cublas_st_ != CUBLAS_STATUS_SUCCESS)                                       \
      return ::flce::cuda::CublasStatus(flce_cublas_st_, #expr, (health));              \
  } while (0)

#endif  // FLCE_KERNELS_CUDA_BASE_CUDA_STATUS_H_
