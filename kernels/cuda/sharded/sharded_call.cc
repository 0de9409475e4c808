#include "kernels/cuda/sharded/sharded_call.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "kernels/cuda/plans/plan_parts.h"

namespace flce::cuda {
namespace {

// The shard's rows as the plan sees them; an empty shard has no columns.
HeadView ShardView(const ShardedHead& head, int s) {
  if (head.part(s) != nullptr) return head.part(s)->view();
  HeadView v;
  v.dtype = head.spec().dtype;
  v.hidden = head.spec().hidden_size;
  return v;
}

}  // namespace

ShardedComputeCall::ShardedComputeCall(ShardedEngine* engine,
                                       std::shared_ptr<const ShardedHead> head, ComputeSpec spec,
                                       GradInputSink sink)
    : engine_(engine),
      head_(std::move(head)),
      spec_(std::move(spec)),
      rows_(spec_),
      sink_(std::move(sink)) {}

absl::StatusOr<std::unique_ptr<ShardedComputeCall>> ShardedComputeCall::Start(
    ShardedEngine* engine, std::shared_ptr<const Head> head, ComputeSpec spec,
    GradInputSink sink) {
  auto sharded = std::dynamic_pointer_cast<const ShardedHead>(head);
  if (sharded == nullptr || sharded->shards().count() != engine->shard_count()) {
    return absl::InvalidArgumentError("head was not built by this sharded CUDA engine");
  }
  FLCE_RETURN_IF_ERROR(
      ValidateSpecFor<ShardedGradBuffer>(spec, sharded->spec(), "sharded CUDA"));
  std::unique_ptr<ShardedComputeCall> call(
      new ShardedComputeCall(engine, std::move(sharded), std::move(spec), std::move(sink)));
  FLCE_RETURN_IF_ERROR(call->Init());
  return call;
}

absl::Status ShardedComputeCall::Init() {
  start_time_ = std::chrono::steady_clock::now();
  const HeadSpec& hs = head_->spec();
  hidden_row_bytes_ = hs.hidden_size * DTypeSize(spec_.hidden_dtype);
  params_ = LossParamsFor(spec_, hs.vocab_size);

  PlanRequest req = PlanRequestFor(spec_);
  req.streaming = false;
  std::vector<HeadView> views;
  for (int s = 0; s < engine_->shard_count(); ++s) views.push_back(ShardView(*head_, s));
  FLCE_ASSIGN_OR_RETURN(plan_, MakeShardPlan(views, req,
                                             engine_->shard(0).workspace().budget()));

  const int64_t n = std::max<int64_t>(spec_.num_tokens, 1);
  buffers_.resize(engine_->shard_count());
  for (int s = 0; s < engine_->shard_count(); ++s) {
    CudaEngine& shard = engine_->shard(s);
    DeviceHealth* health = shard.context()->health();
    FLCE_RETURN_IF_ERROR(shard.context()->Enter());
    ShardBuffers& b = buffers_[s];
    const int64_t device_bytes = Carver::Round(n * hidden_row_bytes_) * (s == 0 ? 2 : 1) +
                                 Carver::Round(kRowInputs * n * 4) +
                                 Carver::Round(kRowOutputs * n * 4) + 256;
    const int64_t pinned_bytes = s == 0 ? n * hidden_row_bytes_ : 0;
    absl::StatusOr<std::unique_ptr<CudaEngine::SlotMemory>> memory =
        shard.TakeSlotMemory(device_bytes, pinned_bytes);
    if (!memory.ok()) {
      return absl::ResourceExhaustedError(absl::StrCat("request buffers of ", device_bytes,
                                                       " bytes on GPU ", engine_->device(s),
                                                       " could not be allocated: ",
                                                       memory.status().message()));
    }
    b.memory = std::move(*memory);
    FLCE_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&b.uploaded, cudaEventDisableTiming),
                              health);
    Carver c(static_cast<char*>(b.memory->device.get()));
    b.hidden = c.TakeBytes(n * hidden_row_bytes_);
    if (s == 0) {
      b.grad_input = c.TakeBytes(n * hidden_row_bytes_);
      staging_ = static_cast<char*>(b.memory->pinned.get());
    }
    b.rows_in = c.TakeBytes(kRowInputs * n * 4);
    b.outputs = c.Take<float>(kRowOutputs * n);
    FLCE_RETURN_IF_ERROR(UploadRowInputs(rows_, b.rows_in, shard.upload_stream(), health));
  }
  return absl::OkStatus();
}

ShardedComputeCall::~ShardedComputeCall() {
  WaitShards();
  for (int s = 0; s < static_cast<int>(buffers_.size()); ++s) {
    if (buffers_[s].uploaded != nullptr) cudaEventDestroy(buffers_[s].uploaded);
    engine_->shard(s).ReturnSlotMemory(std::move(buffers_[s].memory));
  }
}

void ShardedComputeCall::WaitShards() {
  for (int s = 0; s < static_cast<int>(buffers_.size()); ++s) {
    CudaEngine& shard = engine_->shard(s);
    if (!shard.healthy()) continue;
    cudaSetDevice(engine_->device(s));
    cudaStreamSynchronize(shard.upload_stream());
    cudaStreamSynchronize(shard.exec().stream);
  }
}

absl::Status ShardedComputeCall::AddHidden(int64_t token_offset, int64_t rows, const void* data) {
  if (finished_) return absl::FailedPreconditionError("AddHidden after Finish");
  FLCE_RETURN_IF_ERROR(status_);
  FLCE_RETURN_IF_ERROR(
      rows_.Accept(token_offset, rows, data, head_->spec().hidden_size, spec_.hidden_dtype));
  if (rows == 0) return absl::OkStatus();
  // The caller's bytes are only valid during this call: into staging first.
  const int64_t at = token_offset * hidden_row_bytes_;
  const int64_t bytes = rows * hidden_row_bytes_;
  std::memcpy(staging_ + at, data, bytes);
  absl::Status st;
  for (int s = 0; s < engine_->shard_count() && st.ok(); ++s) {
    CudaEngine& shard = engine_->shard(s);
    st = shard.context()->Enter();
    if (st.ok()) {
      st = CudaStatus(cudaMemcpyAsync(buffers_[s].hidden + at, staging_ + at, bytes,
                                      cudaMemcpyHostToDevice, shard.upload_stream()),
                      "uploading hidden rows", shard.context()->health());
    }
  }
  while (st.ok() && given_prefix_ < spec_.num_tokens && rows_.given[given_prefix_]) {
    ++given_prefix_;
  }
  if (st.ok()) st = RunReadyBlocks(false);
  if (!st.ok() && status_.ok()) status_ = st;
  return st;
}

absl::Status ShardedComputeCall::RunReadyBlocks(bool all) {
  const int64_t n = spec_.num_tokens;
  while (next_block_ < n) {
    const int64_t rows = std::min(plan_.chunk_tokens, n - next_block_);
    if (!all && next_block_ + rows > given_prefix_) break;
    FLCE_RETURN_IF_ERROR(RunBlock(next_block_, rows));
    next_block_ += rows;
  }
  return absl::OkStatus();
}

absl::Status ShardedComputeCall::RunBlock(int64_t begin, int64_t rows) {
  const int count = engine_->shard_count();
  const int64_t n = spec_.num_tokens;
  auto* grad = static_cast<ShardedGradBuffer*>(spec_.grad_out);
  // One block's collectives are issued on every shard before another call's.
  std::lock_guard<std::mutex> engine_lock(engine_->compute_mutex());
  std::vector<std::unique_lock<std::mutex>> shard_locks;
  std::vector<ShardTask> tasks(count);
  for (int s = 0; s < count; ++s) {
    CudaEngine& shard = engine_->shard(s);
    shard_locks.emplace_back(shard.submit_mutex());
    FLCE_RETURN_IF_ERROR(shard.context()->Enter());
    DeviceHealth* health = shard.context()->health();
    // The block's rows (and the per-token inputs) have been uploaded.
    FLCE_CUDA_RETURN_IF_ERROR(cudaEventRecord(buffers_[s].uploaded, shard.upload_stream()),
                              health);
    FLCE_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(shard.exec().stream, buffers_[s].uploaded, 0),
                              health);
    ShardTask& t = tasks[s];
    t.device = engine_->device(s);
    t.exec = shard.exec();
    t.exec.switches = &plan_.switches;
    t.head = ShardView(*head_, s);
    t.first_column = head_->shards().begin[s];
    t.columns = head_->shards().rows(s);
    FLCE_ASSIGN_OR_RETURN(t.scratch, shard.Scratch(plan_.scratch_bytes, "sharded plan"));
    const ShardBuffers& b = buffers_[s];
    DeviceRequest whole;
    whole.rows = n;
    whole.hidden_dtype = spec_.hidden_dtype;
    whole.hidden = b.hidden;
    whole.in = rows_.DeviceInputs(b.rows_in, n);
    whole.out = rows_.DeviceOutputs(b.outputs, n, spec_.outputs);
    whole.grad_input = s == 0 && spec_.outputs.grad_input ? b.grad_input : nullptr;
    CudaGradBuffer* part = grad != nullptr ? grad->part(s) : nullptr;
    whole.grad_weight = part != nullptr ? part->weight() : nullptr;
    whole.grad_bias = part != nullptr ? part->bias() : nullptr;
    whole.params = params_;
    t.request = plan_parts::Slice(whole, begin, rows, t.head.hidden);
  }
  kernels_.Add(rows, DescribeShardKernels(plan_, tasks[0]));
  return RunShardedBlock(plan_, tasks, engine_->collective());
}

absl::Status ShardedComputeCall::HandOut() {
  CudaEngine& first = engine_->shard(0);
  DeviceHealth* health = first.context()->health();
  cudaStream_t compute = first.exec().stream;
  FLCE_RETURN_IF_ERROR(first.context()->Enter());
  const int64_t n = spec_.num_tokens;
  FLCE_RETURN_IF_ERROR(DownloadRowOutputs(buffers_[0].outputs, n, compute, health, rows_));
  if (!spec_.outputs.grad_input) return absl::OkStatus();
  return SinkGradInput(buffers_[0].grad_input, n, hidden_row_bytes_, sink_, compute, health);
}

absl::StatusOr<ComputeResult> ShardedComputeCall::Finish() {
  if (finished_) return absl::FailedPreconditionError("Finish called twice");
  finished_ = true;
  FLCE_RETURN_IF_ERROR(status_);
  FLCE_RETURN_IF_ERROR(rows_.CheckAllGiven());
  if (spec_.num_tokens > 0) {
    FLCE_RETURN_IF_ERROR(RunReadyBlocks(true));
    FLCE_RETURN_IF_ERROR(HandOut());
    // grad_W lands on every shard's stream: wait for all of them.
    for (int s = 0; s < engine_->shard_count(); ++s) {
      CudaEngine& shard = engine_->shard(s);
      FLCE_RETURN_IF_ERROR(shard.context()->Enter());
      FLCE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(shard.exec().stream),
                                shard.context()->health());
    }
  }
  ComputeResult result;
  rows_.FillResult(spec_.outputs, result);
  result.strategy_used = StrategyName(plan_.strategy);
  result.kernels = kernels_.Text();
  result.engine_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start_time_)
          .count();
  return result;
}

}  // namespace flce::cuda
