// The two collectives a head split by vocabulary across GPUs needs (one
// process drives every shard from one thread): an all-gather of the per-row
// softmax states and a sum of the partial grad_input rows onto the first
// shard. Both enqueue on the shards' streams and return without waiting.
//
//   nccl          distinct GPUs: NCCL, loaded at run time (nccl_collective.cc)
//   device copies shards side by side on one GPU (an ordinal listed twice),
//                 where NCCL refuses: stream-ordered copies and adds
//
// Both add the partial sums in shard order, so a deterministic request gets
// the same bits every time on the same GPU set.
#ifndef FLCE_KERNELS_CUDA_SHARDED_SHARD_COLLECTIVE_H_
#define FLCE_KERNELS_CUDA_SHARDED_SHARD_COLLECTIVE_H_

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/cuda/base/cuda_status.h"

namespace flce::cuda {

// One shard as the collectives see it: its GPU, the stream its work runs on
// and the health flag its errors go to.
struct ShardLane {
  int device = 0;
  cudaStream_t stream = nullptr;
  DeviceHealth* health = nullptr;
};

class ShardCollective {
 public:
  virtual ~ShardCollective() = default;
  virtual const char* name() const = 0;
  // recv[d] = send[0] ++ send[1] ++ ... (bytes each) for every shard d.
  virtual absl::Status AllGather(const std::vector<const void*>& send,
                                 const std::vector<void*>& recv, int64_t bytes) = 0;
  // parts[0] += parts[1] + ... + parts[N-1] (fp32, count each, added in that
  // order); `scratch` holds count floats on the first shard's GPU.
  virtual absl::Status SumToFirst(const std::vector<float*>& parts, int64_t count,
                                  float* scratch) = 0;
};

// The collective for these lanes: device copies when a GPU is listed twice,
// else NCCL (UNAVAILABLE naming where it was looked for when missing).
absl::StatusOr<std::unique_ptr<ShardCollective>> CreateShardCollective(
    const std::vector<ShardLane>& lanes);

// Building blocks, for the factory and for tests that want one kind.
std::unique_ptr<ShardCollective> CreateDeviceCopyCollective(const std::vector<ShardLane>& lanes);
absl::StatusOr<std::unique_ptr<ShardCollective>> CreateNcclCollective(
    const std::vector<ShardLane>& lanes);

}  // namespace flce::cuda

#endif  // FLCE_KERNELS_CUDA_SHARDED_SHARD_COLLECTIVE_H_
