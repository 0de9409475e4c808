// Owning handles for device and pinned host memory, and the engine's workspace
// pool: one device allocation that grows (never shrinks) up to the budget, so
// that no cudaMalloc happens once a shape has been seen, and whose size does
// not depend on the number of tokens.
#ifndef FLCE_KERNELS_CUDA_BASE_DEVICE_MEMORY_H_
#define FLCE_KERNELS_CUDA_BASE_DEVICE_MEMORY_H_

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "kernels/cuda/base/cuda_status.h"

namespace flce::cuda {

// The two kinds of memory the engine allocates.
struct DeviceMemory {
  static constexpr const char* kAllocator = "cudaMalloc";
  static cudaError_t Allocate(void** ptr, size_t bytes) { return cudaMalloc(ptr, bytes); }
  static cudaError_t Free(void* ptr) { return cudaFree(ptr); }
  // Frees device memory kept for reuse (DeviceContext's spare gradient
  // buffers) when cudaMalloc runs out, before it is tried once more. True
  // when anything was freed.
  static bool Reclaim();
};
struct PinnedHostMemory {
  static constexpr const char* kAllocator = "cudaMallocHost";
  static cudaError_t Allocate(void** ptr, size_t bytes) { return cudaMallocHost(ptr, bytes); }
  static cudaError_t Free(void* ptr) { return cudaFreeHost(ptr); }
  static bool Reclaim() { return false; }
};

// Who keeps device memory for reuse registers what frees it (DeviceMemory::
// Reclaim calls every registered function); `owner` names the registration.
void RegisterReclaimer(const void* owner, std::function<bool()> reclaim);
void UnregisterReclaimer(const void* owner);

// An owning handle on one allocation of `Memory`.
template <typename Memory>
class CudaAllocation {
 public:
  CudaAllocation() = default;
  ~CudaAllocation() { Reset(); }
  CudaAllocation(const CudaAllocation&) = delete;
  CudaAllocation& operator=(const CudaAllocation&) = delete;
  CudaAllocation(CudaAllocation&& other) noexcept
      : ptr_(std::exchange(other.ptr_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}
  CudaAllocation& operator=(CudaAllocation&& other) noexcept {
    if (this != &other) {
      Reset();
      ptr_ = std::exchange(other.ptr_, nullptr);
      bytes_ = std::exchange(other.bytes_, 0);
    }
    return *this;
  }

  // RESOURCE_EXHAUSTED (naming the allocator and the size) when out of memory.
  static absl::StatusOr<CudaAllocation> Allocate(int64_t bytes, DeviceHealth* health) {
    CudaAllocation buffer;
    if (bytes <= 0) return buffer;
    cudaError_t error = Memory::Allocate(&buffer.ptr_, static_cast<size_t>(bytes));
    if (error == cudaErrorMemoryAllocation && Memory::Reclaim()) {
      cudaGetLastError();
      error = Memory::Allocate(&buffer.ptr_, static_cast<size_t>(bytes));
    }
    if (error != cudaSuccess) {
      buffer.ptr_ = nullptr;
      const std::string what = absl::StrCat(Memory::kAllocator, " of ", bytes, " bytes");
      return CudaStatus(error, what.c_str(), health);
    }
    buffer.bytes_ = bytes;
    return buffer;
  }
  void Reset() {
    // Errors here are sticky ones already reported elsewhere; nothing to do.
    if (ptr_ != nullptr) Memory::Free(ptr_);
    ptr_ = nullptr;
    bytes_ = 0;
  }
  void* get() const { return ptr_; }
  int64_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  int64_t bytes_ = 0;
};

using DeviceBuffer = CudaAllocation<DeviceMemory>;
using PinnedBuffer = CudaAllocation<PinnedHostMemory>;

// Bump allocation over a base pointer, 256-byte aligned pieces.
class Carver {
 public:
  explicit Carver(char* base) : base_(base) {}
  template <typename T>
  T* Take(int64_t count) {
    return reinterpret_cast<T*>(TakeBytes(count * static_cast<int64_t>(sizeof(T))));
  }
  char* TakeBytes(int64_t bytes);
  int64_t used() const { return used_; }
  static int64_t Round(int64_t bytes) { return (bytes + 255) / 256 * 256; }

 private:
  char* base_;
  int64_t used_ = 0;
};

// The device scratch workspace (grow-only up to the budget) and the peak
// accounting. Callers hold the engine's submit lock while using Device().
class Workspace {
 public:
  Workspace(int64_t budget_bytes, DeviceHealth* health) : budget_(budget_bytes), health_(health) {}

  // RESOURCE_EXHAUSTED naming needed vs available when over the budget.
  absl::StatusOr<char*> Device(int64_t bytes, const char* purpose);

  // Request buffers (whole-request hidden/grad_input of buffered strategies,
  // pooled upload/download slots) count towards the peak while they live.
  void AddRequestBytes(int64_t delta);

  int64_t budget() const { return budget_; }
  int64_t peak() const;
  int64_t capacity() const;

 private:
  int64_t budget_;
  DeviceHealth* health_;
  DeviceBuffer device_;
  mutable std::mutex mu_;
  int64_t request_bytes_ = 0;
  int64_t peak_ = 0;
};

}  // namespace flce::cuda

#endif  // FLCE_KERNELS_CUDA_BASE_DEVICE_MEMORY_H_
