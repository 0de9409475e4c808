#include "kernels/cuda/base/stage_timer.h"

namespace flce::cuda {

StageTimer::~StageTimer() {
  for (cudaEvent_t e : pool_) cudaEventDestroy(e);
}

cudaEvent_t StageTimer::Take() {
  if (used_ == pool_.size()) {
    cudaEvent_t e = nullptr;
    if (cudaEventCreate(&e) != cudaSuccess) return nullptr;
    pool_.push_back(e);
  }
  return pool_[used_++];
}

void StageTimer::Begin(cudaStream_t stream) {
  used_ = 0;
  marks_.clear();
  failed_ = false;
  Mark(stream, nullptr);
}

void StageTimer::Mark(cudaStream_t stream, const char* name) {
  cudaEvent_t e = Take();
  if (e == nullptr || cudaEventRecord(e, stream) != cudaSuccess) {
    failed_ = true;
    return;
  }
  marks_.emplace_back(name, e);
}

std::map<std::string, double> StageTimer::Totals() const {
  std::map<std::string, double> totals;
  if (failed_) totals["(unmarked)"] = -1.0;
  for (size_t i = 1; i < marks_.size(); ++i) {
    float ms = 0.0f;
    if (cudaEventElapsedTime(&ms, marks_[i - 1].second, marks_[i].second) != cudaSuccess) {
      totals["(unmarked)"] = -1.0;
      continue;
    }
    totals[marks_[i].first] += ms;
  }
  return totals;
}

}  // namespace flce::cuda
