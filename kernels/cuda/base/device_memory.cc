#include "kernels/cuda/base/device_memory.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace flce::cuda {
namespace {

struct Reclaimers {
  std::mutex mu;
  std::vector<std::pair<const void*, std::function<bool()>>> all;
};

Reclaimers& TheReclaimers() {
  static Reclaimers* reclaimers = new Reclaimers();
  return *reclaimers;
}

}  // namespace

bool DeviceMemory::Reclaim() {
  Reclaimers& r = TheReclaimers();
  std::lock_guard<std::mutex> lock(r.mu);
  bool freed = false;
  for (auto& [owner, reclaim] : r.all) freed = reclaim() || freed;
  return freed;
}

void RegisterReclaimer(const void* owner, std::function<bool()> reclaim) {
  Reclaimers& r = TheReclaimers();
  std::lock_guard<std::mutex> lock(r.mu);
  r.all.emplace_back(owner, std::move(reclaim));
}

void UnregisterReclaimer(const void* owner) {
  Reclaimers& r = TheReclaimers();
  std::lock_guard<std::mutex> lock(r.mu);
  r.all.erase(std::remove_if(r.all.begin(), r.all.end(),
                             [owner](const auto& entry) { return entry.first == owner; }),
              r.all.end());
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
        " MiB); the budget is ", budget_, " bytes (", budget_ >> 20, " MiB, --workspace-mb)"));
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
