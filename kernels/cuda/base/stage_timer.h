// Where a whole run's device time goes, stage by stage: the plans mark the
// end of each stage on their stream when Exec carries a timer (benchmarks
// only; the served path passes none). Stage times measured one by one in
// isolation miss what a sustained run pays (clocks under the power limit,
// caches shared with the stage before), so the benchmark reports both.
#ifndef FLCE_KERNELS_CUDA_BASE_STAGE_TIMER_H_
#define FLCE_KERNELS_CUDA_BASE_STAGE_TIMER_H_

#include <cuda_runtime.h>

#include <map>
#include <string>
#include <vector>

namespace flce::cuda {

class StageTimer {
 public:
  StageTimer() = default;
  StageTimer(const StageTimer&) = delete;
  StageTimer& operator=(const StageTimer&) = delete;
  ~StageTimer();

  // Starts a run: the first stage is timed from here.
  void Begin(cudaStream_t stream);
  // Closes stage `name` (a string literal): the time since the previous mark
  // is added to its total.
  void Mark(cudaStream_t stream, const char* name);
  // Once the stream has completed: milliseconds per stage, summed over the
  // run's marks; "(unmarked)" if an event could not be recorded.
  std::map<std::string, double> Totals() const;

 private:
  cudaEvent_t Take();
  std::vector<cudaEvent_t> pool_;
  size_t used_ = 0;
  std::vector<std::pair<const char*, cudaEvent_t>> marks_;
  bool failed_ = false;
};

}  // namespace flce::cuda

#endif  // FLCE_KERNELS_CUDA_BASE_STAGE_TIMER_H_
