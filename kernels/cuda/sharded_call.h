// One compute call on a head split across GPUs. Hidden rows are copied to
// every shard's GPU as they arrive; Finish runs the sharded plan block by
// block with the engine's compute lock held, then hands grad_input out from
// the first shard in pieces.
#ifndef FLCE_KERNELS_CUDA_SHARDED_CALL_H_
#define FLCE_KERNELS_CUDA_SHARDED_CALL_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/cuda/call_rows.h"
#include "kernels/cuda/device_memory.h"
#include "kernels/cuda/plan_sharded.h"
#include "kernels/cuda/sharded_engine.h"
#include "kernels/cuda/sharded_objects.h"
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
    DeviceBuffer memory;
    int64_t bytes = 0;
    char* hidden = nullptr;
    char* grad_input = nullptr;  // the first shard only
    int32_t* target = nullptr;
    float* token_weight = nullptr;
    float* entropy_weight = nullptr;
    float* outputs = nullptr;  // kRowOutputs x n
  };

  ShardedComputeCall(ShardedEngine* engine, std::shared_ptr<const ShardedHead> head,
                     ComputeSpec spec, GradInputSink sink);
  absl::Status Init();
  absl::Status RunBlocks();
  absl::Status HandOut();
  // Every shard's streams idle (nothing may still use the buffers).
  void WaitShards();

  ShardedEngine* engine_;
  std::shared_ptr<const ShardedHead> head_;
  ComputeSpec spec_;
  CallRows rows_;
  GradInputSink sink_;
  ShardPlan plan_;
  LossParams params_;
  int64_t hidden_row_bytes_ = 0;
  bool finished_ = false;
  std::chrono::steady_clock::time_point start_time_;
  std::vector<ShardBuffers> buffers_;
};

}  // namespace flce::cuda

#endif  // FLCE_KERNELS_CUDA_SHARDED_CALL_H_
