#include "kernels/cuda/sharded_call.h"

#include <algorithm>
#include <mutex>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/plan_parts.h"
#include "kernels/status_macros.h"

namespace flce::cuda {
namespace {

constexpr int64_t kSinkRows = 8192;  // grad_input is handed out in pieces

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
  FLCE_RETURN_IF_ERROR(ValidateSpecInputs(spec, sharded->spec()));
  if (spec.grad_out != nullptr) {
    const auto* g = dynamic_cast<const ShardedGradBuffer*>(spec.grad_out);
    if (g == nullptr) {
      return absl::InvalidArgumentError(
          "grad_out is not a gradient buffer of the sharded CUDA engine");
    }
    if (g->vocab_size() != sharded->spec().vocab_size ||
        g->hidden_size() != sharded->spec().hidden_size ||
        g->has_bias() != sharded->spec().has_bias) {
      return absl::InvalidArgumentError("grad_out's shape differs from the head's");
    }
  }
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

  PlanRequest req;
  req.strategy = spec_.strategy;
  req.num_tokens = spec_.num_tokens;
  req.hidden_dtype = spec_.hidden_dtype;
  req.chunk_tokens = spec_.chunk_tokens;
  req.deterministic = spec_.deterministic;
  req.streaming = false;
  std::vector<HeadView> views;
  for (int s = 0; s < engine_->shard_count(); ++s) views.push_back(ShardView(*head_, s));
  FLCE_ASSIGN_OR_RETURN(plan_, MakeShardPlan(views, req,
                                             engine_->shard(0).workspace().budget()));

  const int64_t n = std::max<int64_t>(spec_.num_tokens, 1);
  const int64_t m = spec_.num_tokens;
  buffers_.resize(engine_->shard_count());
  for (int s = 0; s < engine_->shard_count(); ++s) {
    CudaEngine& shard = engine_->shard(s);
    DeviceHealth* health = shard.context()->health();
    FLCE_RETURN_IF_ERROR(shard.context()->Enter());
    ShardBuffers& b = buffers_[s];
    b.bytes = Carver::Round(n * hidden_row_bytes_) * (s == 0 ? 2 : 1) +
              Carver::Round(n * 4) * (3 + kRowOutputs) + 256;
    absl::StatusOr<DeviceBuffer> memory = DeviceBuffer::Allocate(b.bytes, health);
    if (!memory.ok()) {
      return absl::ResourceExhaustedError(absl::StrCat("request buffers of ", b.bytes,
                                                       " bytes on GPU ", engine_->device(s),
                                                       " could not be allocated: ",
                                                       memory.status().message()));
    }
    b.memory = std::move(*memory);
    shard.workspace().AddRequestBytes(b.bytes);
    Carver c(static_cast<char*>(b.memory.get()));
    b.hidden = c.TakeBytes(n * hidden_row_bytes_);
    if (s == 0) b.grad_input = c.TakeBytes(n * hidden_row_bytes_);
    b.target = c.Take<int32_t>(n);
    b.token_weight = c.Take<float>(n);
    b.entropy_weight = c.Take<float>(n);
    b.outputs = c.Take<float>(kRowOutputs * n);
    cudaStream_t up = shard.upload_stream();
    FLCE_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(b.target, rows_.target.data(), m * 4, cudaMemcpyHostToDevice, up), health);
    FLCE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(b.token_weight, rows_.token_weight.data(), m * 4,
                                              cudaMemcpyHostToDevice, up),
                              health);
    FLCE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(b.entropy_weight, rows_.entropy_weight.data(), m * 4,
                                              cudaMemcpyHostToDevice, up),
                              health);
    FLCE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(up), health);
  }
  return absl::OkStatus();
}

ShardedComputeCall::~ShardedComputeCall() {
  WaitShards();
  for (int s = 0; s < static_cast<int>(buffers_.size()); ++s) {
    if (buffers_[s].bytes == 0) continue;
    buffers_[s].memory.Reset();
    engine_->shard(s).workspace().AddRequestBytes(-buffers_[s].bytes);
  }
}

void ShardedComputeCall::WaitShards() {
  for (int s = 0; s < engine_->shard_count(); ++s) {
    CudaEngine& shard = engine_->shard(s);
    if (!shard.healthy()) continue;
    cudaSetDevice(engine_->device(s));
    cudaStreamSynchronize(shard.upload_stream());
    cudaStreamSynchronize(shard.exec().stream);
  }
}

absl::Status ShardedComputeCall::AddHidden(int64_t token_offset, int64_t rows, const void* data) {
  if (finished_) return absl::FailedPreconditionError("AddHidden after Finish");
  FLCE_RETURN_IF_ERROR(
      rows_.Accept(token_offset, rows, data, head_->spec().hidden_size, spec_.hidden_dtype));
  if (rows == 0) return absl::OkStatus();
  for (int s = 0; s < engine_->shard_count(); ++s) {
    CudaEngine& shard = engine_->shard(s);
    FLCE_RETURN_IF_ERROR(shard.context()->Enter());
    cudaStream_t up = shard.upload_stream();
    DeviceHealth* health = shard.context()->health();
    FLCE_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(buffers_[s].hidden + token_offset * hidden_row_bytes_, data,
                        rows * hidden_row_bytes_, cudaMemcpyHostToDevice, up),
        health);
    // The caller's bytes are only valid during this call.
    FLCE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(up), health);
  }
  return absl::OkStatus();
}

absl::Status ShardedComputeCall::RunBlocks() {
  const int count = engine_->shard_count();
  const int64_t n = spec_.num_tokens;
  auto* grad = static_cast<ShardedGradBuffer*>(spec_.grad_out);
  std::lock_guard<std::mutex> engine_lock(engine_->compute_mutex());
  std::vector<std::unique_lock<std::mutex>> shard_locks;
  std::vector<ShardTask> tasks(count);
  for (int s = 0; s < count; ++s) {
    CudaEngine& shard = engine_->shard(s);
    shard_locks.emplace_back(shard.submit_mutex());
    FLCE_RETURN_IF_ERROR(shard.context()->Enter());
    ShardTask& t = tasks[s];
    t.device = engine_->device(s);
    t.exec = shard.exec();
    t.head = ShardView(*head_, s);
    t.first_column = head_->shards().begin[s];
    t.columns = head_->shards().rows(s);
    FLCE_ASSIGN_OR_RETURN(t.scratch, shard.Scratch(plan_.scratch_bytes, "sharded plan"));
    const ShardBuffers& b = buffers_[s];
    DeviceRequest& r = t.request;
    r.rows = n;
    r.hidden_dtype = spec_.hidden_dtype;
    r.hidden = b.hidden;
    r.in.target = b.target;
    r.in.token_weight = b.token_weight;
    r.in.entropy_weight = b.entropy_weight;
    r.out = DeviceRowOutputs(b.outputs, n);
    r.grad_input = s == 0 && spec_.outputs.grad_input ? b.grad_input : nullptr;
    CudaGradBuffer* part = grad != nullptr ? grad->part(s) : nullptr;
    r.grad_weight = part != nullptr ? part->weight() : nullptr;
    r.grad_bias = part != nullptr ? part->bias() : nullptr;
    r.params = params_;
  }
  for (int64_t begin = 0; begin < n; begin += plan_.chunk_tokens) {
    const int64_t rows = std::min(plan_.chunk_tokens, n - begin);
    std::vector<ShardTask> block = tasks;
    for (int s = 0; s < count; ++s) {
      const int64_t hidden = block[s].head.hidden;
      block[s].request = plan_parts::Slice(tasks[s].request, begin, rows, hidden);
    }
    FLCE_RETURN_IF_ERROR(RunShardedBlock(plan_, block, engine_->collective()));
  }
  return absl::OkStatus();
}

absl::Status ShardedComputeCall::HandOut() {
  CudaEngine& first = engine_->shard(0);
  DeviceHealth* health = first.context()->health();
  cudaStream_t compute = first.exec().stream;
  FLCE_RETURN_IF_ERROR(first.context()->Enter());
  const int64_t n = spec_.num_tokens;
  std::vector<float> outputs(kRowOutputs * n);
  FLCE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(outputs.data(), buffers_[0].outputs,
                                            outputs.size() * 4, cudaMemcpyDeviceToHost, compute),
                            health);
  FLCE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(compute), health);
  rows_.Store(outputs.data(), n, 0, n);
  if (!spec_.outputs.grad_input) return absl::OkStatus();
  for (int64_t b = 0; b < n; b += kSinkRows) {
    const int64_t rows = std::min(kSinkRows, n - b);
    std::string data(rows * hidden_row_bytes_, '\0');
    FLCE_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(data.data(), buffers_[0].grad_input + b * hidden_row_bytes_, data.size(),
                        cudaMemcpyDeviceToHost, compute),
        health);
    FLCE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(compute), health);
    if (sink_) sink_(b, rows, std::move(data));
  }
  return absl::OkStatus();
}

absl::StatusOr<ComputeResult> ShardedComputeCall::Finish() {
  if (finished_) return absl::FailedPreconditionError("Finish called twice");
  finished_ = true;
  FLCE_RETURN_IF_ERROR(rows_.CheckAllGiven());
  if (spec_.num_tokens > 0) {
    FLCE_RETURN_IF_ERROR(RunBlocks());
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
  result.engine_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start_time_)
          .count();
  return result;
}

}  // namespace flce::cuda
