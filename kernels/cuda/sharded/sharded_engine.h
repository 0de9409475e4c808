// flce::Engine over several GPUs (--gpus): each head's W, bias, gradient
// and optimizer state are split by vocabulary rows across one CudaEngine per
// GPU (sharded_objects.h); a compute call runs the sharded plan
// (plan_sharded.h) on all of them, with NCCL between distinct GPUs or device
// copies between shards listed on the same GPU. The server sees one engine.
#ifndef FLCE_KERNELS_CUDA_SHARDED_SHARDED_ENGINE_H_
#define FLCE_KERNELS_CUDA_SHARDED_SHARDED_ENGINE_H_

#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/cuda/engine/cuda_engine.h"
#include "kernels/cuda/sharded/shard_collective.h"
#include "kernels/engine.h"

namespace flce::cuda {

class ShardedEngine : public Engine {
 public:
  // One shard per entry of config.devices (at least one); each gets
  // config.workspace_bytes of workspace on its GPU. `collective` replaces
  // CreateShardCollective (tests that make a collective fail).
  using CollectiveFactory = std::function<absl::StatusOr<std::unique_ptr<ShardCollective>>(
      const std::vector<ShardLane>&)>;
  static absl::StatusOr<std::unique_ptr<ShardedEngine>> Create(
      const EngineConfig& config, const CollectiveFactory& collective = nullptr);

  EngineInfo info() const override;
  absl::StatusOr<std::unique_ptr<HeadBuilder>> BeginHead(const HeadSpec& spec) override;
  absl::StatusOr<std::unique_ptr<GradBuffer>> NewGradBuffer(const HeadSpec& spec) override;
  absl::StatusOr<std::unique_ptr<ComputeCall>> StartCompute(std::shared_ptr<const Head> head,
                                                            ComputeSpec spec,
                                                            GradInputSink sink) override;
  absl::StatusOr<std::unique_ptr<HeadOptimizer>> CreateOptimizer(
      std::shared_ptr<const Head> head, const OptimizerConfig& config) override;
  absl::StatusOr<std::shared_ptr<const PeerMemory>> OpenPeerMemory(
      const PeerMemoryHandle& handle) override;
  absl::StatusOr<std::shared_ptr<const PeerMemory>> RegisterHostMemory(void* base,
                                                                       int64_t bytes) override;
  bool healthy() const override;

  // For ShardedComputeCall.
  int shard_count() const { return static_cast<int>(shards_.size()); }
  CudaEngine& shard(int s) const { return *shards_[s]; }
  int device(int s) const { return devices_[s]; }
  ShardCollective& collective() const { return *collective_; }
  // Held while a call enqueues work on every shard: the shards' collectives
  // must be issued in the same order on all of them.
  std::mutex& compute_mutex() { return compute_mu_; }

 private:
  ShardedEngine() = default;
  std::vector<int> devices_;
  std::vector<std::unique_ptr<CudaEngine>> shards_;
  std::unique_ptr<ShardCollective> collective_;
  std::mutex compute_mu_;
};

}  // namespace flce::cuda

#endif  // FLCE_KERNELS_CUDA_SHARDED_SHARDED_ENGINE_H_
