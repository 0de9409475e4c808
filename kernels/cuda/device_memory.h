// Owning handles for device and pinned host memory, and the engine's workspace
// pool: one device allocation that grows (never shrinks) up to the budget, so
// that no cudaMalloc happens once a shape has been seen, and whose size does
// not depend on the number of tokens.
#ifndef FLCE_KERNELS_CUDA_DEVICE_MEMORY_H_
#define FLCE_KERNELS_CUDA_DEVICE_MEMORY_H_

#include <cstddef>
#include <cstdint>
#include <mutex>

#include "absl/status/statusor.h"
#include "kernels/cuda/cuda_status.h"

namespace flce::cuda {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;

  static absl::StatusOr<DeviceBuffer> Allocate(int64_t bytes, DeviceHealth* health);
  void Reset();
  void* get() const { return ptr_; }
  int64_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  int64_t bytes_ = 0;
};

class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  ~PinnedBuffer();
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  PinnedBuffer(PinnedBuffer&& other) noexcept;
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept;

  static absl::StatusOr<PinnedBuffer> Allocate(int64_t bytes, DeviceHealth* health);
  void Reset();
  void* get() const { return ptr_; }
  int64_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  int64_t bytes_ = 0;
};

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
  Workspace(int64_t budget_bytes, DeviceHealth* health)
      : budget_(budget_bytes), health_(health) {}

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

#endif  // FLCE_KERNELS_CUDA_DEVICE_MEMORY_H_
