// One compute call on a head split across GPUs. Hidden rows go into pinned
// staging as they arrive and from there to every shard's GPU (uploads
// enqueued, not waited for); each block of the plan is computed as soon as
// all its rows are there, so the compute of early blocks overlaps the
// arrival of later ones. Finish computes the rest, then hands grad_input out
// from the first shard in pieces. Request memory comes from each shard
// engine's pool: nothing is allocated per call once the pool has grown.
#ifndef FLCE_KERNELS_CUDA_SHARDED_SHARDED_CALL_H_
#define FLCE_KERNELS_CUDA_SHARDED_SHARDED_CALL_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/cuda/base/device_memory.h"
#include "kernels/cuda/engine/call_rows.h"
#include "kernels/cuda/plans/kernel_report.h"
#include "kernels/cuda/sharded/plan_sharded.h"
#include "kernels/cuda/sharded/sharded_engine.h"
#include "kernels/cuda/sharded/sharded_objects.h"
#include "kernels/engine.h"

namespace flce::cuda {

class ShardedComputeCall : public ComputeCall {
 public:
  static absl::StatusOr<std::unique_ptr<ShardedComputeCall>> Start(
      ShardedEngine* engine, std::shared_ptr<const Head> head, ComputeSpec spec,
      GradInputSink sink);
  ~ShardedComputeCall() override;

  absl::Status AddHidden(int64_t token_offset, int64_t rows, const void* data) override;
  absl::StatusOr<ComputeResult> Finish() override;

 private:
  // The whole request on one shard's GPU.
  struct ShardBuffers {
    std::unique_ptr<CudaEngine::SlotMemory> memory;  // device; the first's pinned holds hidden
    cudaEvent_t uploaded = nullptr;
    char* hidden = nullptr;
    char* grad_input = nullptr;  // the first shard only
    char* rows_in = nullptr;   // CallRows' input block, stride n
    float* outputs = nullptr;  // CallRows' output block, stride n
  };

  ShardedComputeCall(ShardedEngine* engine, std::shared_ptr<const ShardedHead> head,
                     ComputeSpec spec, GradInputSink sink);
  absl::Status Init();
  // Computes every block whose rows have all been given (with `all`, the
  // last partial block too).
  absl::Status RunReadyBlocks(bool all);
  absl::Status RunBlock(int64_t begin, int64_t rows);
  absl::Status HandOut();
  // Every shard's streams idle (nothing may still use the buffers).
  void WaitShards();

  ShardedEngine* engine_;
  std::shared_ptr<const ShardedHead> head_;
  ComputeSpec spec_;
  CallRows rows_;
  GradInputSink sink_;
  ShardPlan plan_;
  KernelReport kernels_;
  LossParams params_;
  int64_t hidden_row_bytes_ = 0;
  bool finished_ = false;
  std::chrono::steady_clock::time_point start_time_;
  std::vector<ShardBuffers> buffers_;
  char* staging_ = nullptr;  // pinned, num_tokens rows
  int64_t given_prefix_ = 0;  // rows [0, given_prefix_) have all been given
  int64_t next_block_ = 0;    // first row not yet computed
  absl::Status status_;       // the first failure: later calls return it
};

}  // namespace flce::cuda

#endif  // FLCE_KERNELS_CUDA_SHARDED_SHARDED_CALL_H_
