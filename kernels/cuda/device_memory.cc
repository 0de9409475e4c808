#include "kernels/cuda/device_memory.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/status_macros.h"

namespace flce::cuda {

DeviceBuffer::~DeviceBuffer() { Reset(); }
DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : ptr_(std::exchange(other.ptr_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    Reset();
    ptr_ = std::exchange(other.ptr_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}
void DeviceBuffer::Reset() {
  // Errors here are sticky ones already reported elsewhere; nothing to do.
  if (ptr_ != nullptr) cudaFree(ptr_);
  ptr_ = nullptr;
  bytes_ = 0;
}
absl::StatusOr<DeviceBuffer> DeviceBuffer::Allocate(int64_t bytes, DeviceHealth* health) {
  DeviceBuffer buffer;
  if (bytes <= 0) return buffer;
  FLCE_CUDA_RETURN_IF_ERROR(cudaMalloc(&buffer.ptr_, static_cast<size_t>(bytes)), health);
  buffer.bytes_ = bytes;
  return buffer;
}

PinnedBuffer::~PinnedBuffer() { Reset(); }
PinnedBuffer::PinnedBuffer(PinnedBuffer&& other) noexcept
    : ptr_(std::exchange(other.ptr_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}
PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& other) noexcept {
  if (this != &other) {
    Reset();
    ptr_ = std::exchange(other.ptr_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}
void PinnedBuffer::Reset() {
  if (ptr_ != nullptr) cudaFreeHost(ptr_);
  ptr_ = nullptr;
  bytes_ = 0;
}
absl::StatusOr<PinnedBuffer> PinnedBuffer::Allocate(int64_t bytes, DeviceHealth* health) {
  PinnedBuffer buffer;
  if (bytes <= 0) return buffer;
  FLCE_CUDA_RETURN_IF_ERROR(cudaMallocHost(&buffer.ptr_, static_cast<size_t>(bytes)), health);
  buffer.bytes_ = bytes;
  return buffer;
}

char* Carver::TakeBytes(int64_t bytes) {
  char* out = base_ + used_;
  used_ += Round(bytes);
  return out;
}

absl::StatusOr<char*> Workspace::Device(int64_t bytes, const char* purpose) {
  std::lock_guard<std::mutex> lock(mu_);
  if (bytes > budget_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        purpose, " needs ", bytes, " bytes of device workspace (", bytes >> 20,
        " MiB); the budget is ", budget_, " bytes (", budget_ >> 20,
        " MiB, --workspace-mb)"));
  }
  if (bytes > device_.bytes()) {
    // Grow-only: the old buffer is released first so that the peak stays
    // within the budget.
    device_.Reset();
    FLCE_ASSIGN_OR_RETURN(device_, DeviceBuffer::Allocate(bytes, health_));
  }
  peak_ = std::max(peak_, device_.bytes() + request_bytes_);
  return static_cast<char*>(device_.get());
}

void Workspace::AddRequestBytes(int64_t delta) {
  std::lock_guard<std::mutex> lock(mu_);
  request_bytes_ += delta;
  peak_ = std::max(peak_, device_.bytes() + request_bytes_);
}

int64_t Workspace::peak() const {
  std::lock_guard<std::mutex> lock(mu_);
  return peak_;
}

int64_t Workspace::capacity() const {
  std::lock_guard<std::mutex> lock(mu_);
  return device_.bytes();
}

}  // namespace flce::cuda
