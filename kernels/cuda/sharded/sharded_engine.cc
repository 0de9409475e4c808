#include "kernels/cuda/sharded/sharded_engine.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "kernels/cuda/sharded/sharded_call.h"
#include "kernels/cuda/sharded/sharded_objects.h"

namespace flce::cuda {
namespace {

absl::Status CheckShape(const HeadSpec& spec, const char* what) {
  if (spec.vocab_size <= 0 || spec.hidden_size <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, " shape ", spec.vocab_size, " x ",
                                                   spec.hidden_size, " must be positive"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<ShardedEngine>> ShardedEngine::Create(
    const EngineConfig& config, const CollectiveFactory& collective) {
  if (config.devices.empty()) return absl::InvalidArgumentError("no GPUs to shard a head across");
  std::unique_ptr<ShardedEngine> e(new ShardedEngine());
  e->devices_ = config.devices;
  std::vector<ShardLane> lanes;
  for (int device : config.devices) {
    EngineConfig one = config;
    one.devices.clear();
    one.device_ordinal = device;
    absl::StatusOr<std::unique_ptr<CudaEngine>> shard = CudaEngine::Create(one);
    if (!shard.ok()) {
      return absl::Status(shard.status().code(), absl::StrCat("GPU ", device, ": ",
                                                              shard.status().message()));
    }
    lanes.push_back({device, (*shard)->exec().stream, (*shard)->context()->health()});
    e->shards_.push_back(std::move(*shard));
  }
  FLCE_ASSIGN_OR_RETURN(e->collective_,
                        collective ? collective(lanes) : CreateShardCollective(lanes));
  return e;
}

EngineInfo ShardedEngine::info() const {
  EngineInfo info = shards_[0]->info();
  for (size_t s = 1; s < shards_.size(); ++s) {
    const EngineInfo more = shards_[s]->info();
    info.workspace_budget_bytes += more.workspace_budget_bytes;
    info.workspace_peak_bytes += more.workspace_peak_bytes;
    // A GPU listed twice is counted once.
    bool seen = false;
    for (size_t p = 0; p < s; ++p) seen = seen || devices_[p] == devices_[s];
    if (!seen) {
      info.device_memory_used += more.device_memory_used;
      info.device_memory_total += more.device_memory_total;
    }
  }
  info.name = absl::StrCat(info.name, " x", shards_.size(), " (vocabulary split, ",
                           collective_->name(), ")");
  // No one GPU to name: the server then offers neither CUDA IPC nor
  // page-locked shared memory, which both hand hidden rows to one device
  // (shared memory still works, through AddHidden).
  info.device_uuid.clear();
  return info;
}

bool ShardedEngine::healthy() const {
  for (const auto& s : shards_) {
    if (!s->healthy()) return false;
  }
  return true;
}

absl::StatusOr<std::unique_ptr<HeadBuilder>> ShardedEngine::BeginHead(const HeadSpec& spec) {
  FLCE_RETURN_IF_ERROR(CheckShape(spec, "head"));
  const VocabShards shards = VocabShards::Split(spec.vocab_size, shard_count());
  std::vector<std::unique_ptr<HeadBuilder>> parts(shard_count());
  for (int s = 0; s < shard_count(); ++s) {
    if (shards.rows(s) == 0) continue;
    FLCE_ASSIGN_OR_RETURN(parts[s], shards_[s]->BeginHead(ShardSpec(spec, shards, s)));
  }
  return std::unique_ptr<HeadBuilder>(
      std::make_unique<ShardedHeadBuilder>(spec, shards, std::move(parts)));
}

absl::StatusOr<std::unique_ptr<GradBuffer>> ShardedEngine::NewGradBuffer(const HeadSpec& spec) {
  FLCE_RETURN_IF_ERROR(CheckShape(spec, "gradient buffer"));
  const VocabShards shards = VocabShards::Split(spec.vocab_size, shard_count());
  std::vector<std::unique_ptr<CudaGradBuffer>> parts(shard_count());
  for (int s = 0; s < shard_count(); ++s) {
    if (shards.rows(s) == 0) continue;
    FLCE_ASSIGN_OR_RETURN(std::unique_ptr<GradBuffer> part,
                          shards_[s]->NewGradBuffer(ShardSpec(spec, shards, s)));
    parts[s].reset(static_cast<CudaGradBuffer*>(part.release()));
  }
  return std::unique_ptr<GradBuffer>(
      std::make_unique<ShardedGradBuffer>(spec, shards, std::move(parts)));
}

absl::StatusOr<std::unique_ptr<ComputeCall>> ShardedEngine::StartCompute(
    std::shared_ptr<const Head> head, ComputeSpec spec, GradInputSink sink) {
  FLCE_RETURN_IF_ERROR(RefuseTwoPassSpec(spec, "sharded CUDA"));
  FLCE_ASSIGN_OR_RETURN(auto call,
                        ShardedComputeCall::Start(this, std::move(head), std::move(spec),
                                                  std::move(sink)));
  return std::unique_ptr<ComputeCall>(std::move(call));
}

absl::StatusOr<std::unique_ptr<HeadOptimizer>> ShardedEngine::CreateOptimizer(
    std::shared_ptr<const Head> head, const OptimizerConfig& config) {
  auto sharded = std::dynamic_pointer_cast<const ShardedHead>(head);
  if (sharded == nullptr || sharded->shards().count() != shard_count()) {
    return absl::InvalidArgumentError("not a head of this sharded CUDA engine");
  }
  std::vector<std::unique_ptr<CudaHeadOptimizer>> parts(shard_count());
  for (int s = 0; s < shard_count(); ++s) {
    if (sharded->part(s) == nullptr) continue;
    FLCE_ASSIGN_OR_RETURN(std::unique_ptr<HeadOptimizer> part,
                          shards_[s]->CreateOptimizer(sharded->part(s), config));
    parts[s].reset(static_cast<CudaHeadOptimizer*>(part.release()));
  }
  return std::unique_ptr<HeadOptimizer>(std::make_unique<ShardedOptimizer>(
      sharded->spec(), sharded->shards(), std::move(parts)));
}

absl::StatusOr<std::shared_ptr<const PeerMemory>> ShardedEngine::OpenPeerMemory(
    const PeerMemoryHandle&) {
  return absl::FailedPreconditionError(
      "a head split across GPUs (--gpus) takes hidden states in messages; CUDA IPC needs a "
      "server on one GPU");
}

absl::StatusOr<std::shared_ptr<const PeerMemory>> ShardedEngine::RegisterHostMemory(void*,
                                                                                    int64_t) {
  return absl::FailedPreconditionError(
      "a head split across GPUs (--gpus) takes hidden states in messages; shared memory needs "
      "a server on one GPU");
}

}  // namespace flce::cuda
