#include "kernels/cuda/sharded/shard_collective.h"

#include <set>
#include <utility>

#include "core/status_macros.h"
#include "kernels/cuda/ops/elementwise_kernels.cuh"

namespace flce::cuda {
namespace {

// Stream-ordered copies between shards that share a GPU (or can reach each
// other's memory): each consumer's stream waits for the producers' events,
// and each producer's stream waits for its consumers before it may write its
// buffer again.
class DeviceCopyCollective : public ShardCollective {
 public:
  explicit DeviceCopyCollective(std::vector<ShardLane> lanes) : lanes_(std::move(lanes)) {}
  ~DeviceCopyCollective() override {
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
  }
  const char* name() const override { return "device copies"; }

  absl::Status AllGather(const std::vector<const void*>& send, const std::vector<void*>& recv,
                         int64_t bytes) override {
    FLCE_RETURN_IF_ERROR(Init());
    const int n = static_cast<int>(lanes_.size());
    FLCE_RETURN_IF_ERROR(RecordAll());
    for (int d = 0; d < n; ++d) {
      const ShardLane& to = lanes_[d];
      FLCE_RETURN_IF_ERROR(WaitAll(to));
      for (int s = 0; s < n; ++s) {
        FLCE_CUDA_RETURN_IF_ERROR(
            cudaMemcpyPeerAsync(static_cast<char*>(recv[d]) + s * bytes, to.device, send[s],
                                lanes_[s].device, bytes, to.stream),
            to.health);
      }
    }
    return FenceAll();
  }

  absl::Status SumToFirst(const std::vector<float*>& parts, int64_t count,
                          float* scratch) override {
    FLCE_RETURN_IF_ERROR(Init());
    const ShardLane& first = lanes_[0];
    FLCE_RETURN_IF_ERROR(RecordAll());
    FLCE_RETURN_IF_ERROR(WaitAll(first));
    for (size_t s = 1; s < lanes_.size(); ++s) {
      FLCE_CUDA_RETURN_IF_ERROR(cudaMemcpyPeerAsync(scratch, first.device, parts[s],
                                                    lanes_[s].device, count * 4, first.stream),
                                first.health);
      FLCE_RETURN_IF_ERROR(
          LaunchAxpy(1.0f, scratch, parts[0], count, first.stream, first.health));
    }
    return FenceAll();
  }

 private:
  absl::Status Init() {
    if (!events_.empty()) return absl::OkStatus();
    for (const ShardLane& lane : lanes_) {
      FLCE_CUDA_RETURN_IF_ERROR(cudaSetDevice(lane.device), lane.health);
      cudaEvent_t e = nullptr;
      FLCE_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), lane.health);
      events_.push_back(e);
    }
    return absl::OkStatus();
  }
  absl::Status RecordAll() {
    for (size_t s = 0; s < lanes_.size(); ++s) {
      FLCE_CUDA_RETURN_IF_ERROR(cudaSetDevice(lanes_[s].device), lanes_[s].health);
      FLCE_CUDA_RETURN_IF_ERROR(cudaEventRecord(events_[s], lanes_[s].stream), lanes_[s].health);
    }
    return absl::OkStatus();
  }
  absl::Status WaitAll(const ShardLane& lane) {
    FLCE_CUDA_RETURN_IF_ERROR(cudaSetDevice(lane.device), lane.health);
    for (cudaEvent_t e : events_) {
      FLCE_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(lane.stream, e, 0), lane.health);
    }
    return absl::OkStatus();
  }
  // Every shard continues only after every shard's copies are done.
  absl::Status FenceAll() {
    FLCE_RETURN_IF_ERROR(RecordAll());
    for (const ShardLane& lane : lanes_) FLCE_RETURN_IF_ERROR(WaitAll(lane));
    return absl::OkStatus();
  }

  std::vector<ShardLane> lanes_;
  std::vector<cudaEvent_t> events_;
};

}  // namespace

std::unique_ptr<ShardCollective> CreateDeviceCopyCollective(const std::vector<ShardLane>& lanes) {
  return std::make_unique<DeviceCopyCollective>(lanes);
}

absl::StatusOr<std::unique_ptr<ShardCollective>> CreateShardCollective(
    const std::vector<ShardLane>& lanes) {
  std::set<int> devices;
  for (const ShardLane& lane : lanes) devices.insert(lane.device);
  if (devices.size() < lanes.size()) return CreateDeviceCopyCollective(lanes);
  return CreateNcclCollective(lanes);
}

}  // namespace flce::cuda
