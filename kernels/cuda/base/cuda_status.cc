#include "kernels/cuda/base/cuda_status.h"

#include "absl/strings/str_cat.h"

namespace flce::cuda {

absl::Status DeviceHealth::Check() const {
  if (healthy.load(std::memory_order_acquire)) return absl::OkStatus();
  return absl::UnavailableError(
      "CUDA device is in an unrecoverable error state; restart the process");
}

bool IsStickyError(cudaError_t error) {
  switch (error) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorAssert:
    case cudaErrorLaunchTimeout:
    case cudaErrorECCUncorrectable:
    case cudaErrorContextIsDestroyed:
    case cudaErrorUnknown:
      return true;
    default:
      return false;
  }
}

absl::Status CudaStatus(cudaError_t error, const char* what, DeviceHealth* health) {
  if (error == cudaSuccess) return absl::OkStatus();
  std::string msg = absl::StrCat(what, ": ", cudaGetErrorName(error), " (",
                                 cudaGetErrorString(error), ")");
  if (error == cudaErrorMemoryAllocation) {
    // Clear the non-sticky error so that the next call does not see it.
    cudaGetLastError();
    return absl::ResourceExhaustedError(msg);
  }
  if (IsStickyError(error)) {
    if (health != nullptr) health->healthy.store(false, std::memory_order_release);
    return absl::UnavailableError(absl::StrCat("sticky CUDA error, device unusable: ", msg));
  }
  cudaGetLastError();
  return absl::InternalError(msg);
}

absl::Status CublasStatus(cublasStatus_t status, const char* what, DeviceHealth* health) {
  if (status == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  std::string msg = absl::StrCat(what, ": ", cublasGetStatusName(status), " (",
                                 cublasGetStatusString(status), ")");
  if (status == CUBLAS_STATUS_ALLOC_FAILED) return absl::ResourceExhaustedError(msg);
  if (status == CUBLAS_STATUS_EXECUTION_FAILED) {
    // The kernel failed to run: look at the context's error to tell a sticky
    // failure from a transient one.
    cudaError_t last = cudaGetLastError();
    if (IsStickyError(last)) return CudaStatus(last, what, health);
  }
  return absl::InternalError(msg);
}

}  // namespace flce::cuda
