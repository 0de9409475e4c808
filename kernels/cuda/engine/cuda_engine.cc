#include "kernels/cuda/engine/cuda_engine.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "kernels/cuda/base/kernel_choices.h"
#include "kernels/cuda/engine/call_rows.h"
#include "kernels/cuda/engine/compute_call.h"
#include "kernels/cuda/engine/cuda_optimizer.h"
#include "kernels/cuda/engine/peer_memory.h"
#include "kernels/cuda/ops/elementwise_kernels.cuh"
#include "kernels/engine_factory.h"

namespace flce::cuda {

CudaEngine::CudaEngine(std::shared_ptr<DeviceContext> ctx, int64_t budget)
    : ctx_(std::move(ctx)), workspace_(budget, ctx_->health()) {}

absl::StatusOr<std::unique_ptr<CudaEngine>> CudaEngine::Create(const EngineConfig& config) {
  if (config.workspace_bytes <= 0) {
    return absl::InvalidArgumentError("workspace budget must be positive");
  }
  FLCE_ASSIGN_OR_RETURN(auto ctx, DeviceContext::Create(config.device_ordinal));
  // After the device: without one, --device=auto still falls back to the CPU.
  FLCE_RETURN_IF_ERROR(CheckKernelSwitchSpellings());
  std::unique_ptr<CudaEngine> e(new CudaEngine(ctx, config.workspace_bytes));
  DeviceHealth* health = ctx->health();
  FLCE_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&e->compute_, cudaStreamNonBlocking), health);
  FLCE_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&e->upload_, cudaStreamNonBlocking), health);
  FLCE_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&e->download_, cudaStreamNonBlocking),
                            health);
  FLCE_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&e->side_, cudaStreamNonBlocking), health);
  for (cudaEvent_t& ev : e->events_) {
    FLCE_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), health);
  }
  FLCE_CUBLAS_RETURN_IF_ERROR(cublasCreate(&e->cublas_), health);
  FLCE_CUBLAS_RETURN_IF_ERROR(cublasSetStream(e->cublas_, e->compute_), health);
  FLCE_ASSIGN_OR_RETURN(e->gemm_algos_, GemmAlgos::Create());
  return e;
}

CudaEngine::~CudaEngine() {
  free_slots_.clear();
  // Work in flight must end before the streams go; after a sticky error
  // there is nothing to wait for.
  if (healthy()) cudaStreamSynchronize(compute_);
  if (cublas_ != nullptr) cublasDestroy(cublas_);
  for (cudaStream_t s : {compute_, upload_, download_, side_}) {
    if (s != nullptr) cudaStreamDestroy(s);
  }
  for (cudaEvent_t ev : events_) {
    if (ev != nullptr) cudaEventDestroy(ev);
  }
}

bool CudaEngine::healthy() const { return ctx_->health()->healthy.load(); }

EngineInfo CudaEngine::info() const {
  EngineInfo info;
  info.name = absl::StrCat("cuda:", ctx_->name());
  info.workspace_budget_bytes = workspace_.budget();
  info.workspace_peak_bytes = workspace_.peak();
  info.device_uuid = ctx_->uuid();
  info.policy_objectives = true;
  size_t free_b = 0, total_b = 0;
  if (healthy() && cudaSetDevice(ctx_->ordinal()) == cudaSuccess &&
      cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) {
    info.device_memory_used = static_cast<int64_t>(total_b - free_b);
    info.device_memory_total = static_cast<int64_t>(total_b);
  } else {
    cudaGetLastError();
  }
  return info;
}

absl::StatusOr<std::unique_ptr<HeadBuilder>> CudaEngine::BeginHead(const HeadSpec& spec) {
  FLCE_ASSIGN_OR_RETURN(auto b, CudaHeadBuilder::Create(ctx_, spec));
  return std::unique_ptr<HeadBuilder>(std::move(b));
}

absl::StatusOr<std::unique_ptr<GradBuffer>> CudaEngine::NewGradBuffer(const HeadSpec& spec) {
  FLCE_ASSIGN_OR_RETURN(auto g, CudaGradBuffer::Create(ctx_, spec));
  return std::unique_ptr<GradBuffer>(std::move(g));
}

absl::StatusOr<std::unique_ptr<HeadOptimizer>> CudaEngine::CreateOptimizer(
    std::shared_ptr<const Head> head, const OptimizerConfig& config) {
  auto cuda_head = std::dynamic_pointer_cast<const CudaHead>(head);
  if (cuda_head == nullptr || cuda_head->context().get() != ctx_.get()) {
    return absl::InvalidArgumentError("not a head of this CUDA engine");
  }
  FLCE_ASSIGN_OR_RETURN(auto optimizer, CudaHeadOptimizer::Create(std::move(cuda_head), config));
  return std::unique_ptr<HeadOptimizer>(std::move(optimizer));
}

absl::StatusOr<std::shared_ptr<const PeerMemory>> CudaEngine::OpenPeerMemory(
    const PeerMemoryHandle& handle) {
  FLCE_ASSIGN_OR_RETURN(auto memory, CudaPeerMemory::Open(ctx_, handle));
  return std::shared_ptr<const PeerMemory>(std::move(memory));
}

absl::StatusOr<std::shared_ptr<const PeerMemory>> CudaEngine::RegisterHostMemory(void* base,
                                                                                 int64_t bytes) {
  FLCE_ASSIGN_OR_RETURN(auto memory, CudaPeerMemory::RegisterHost(ctx_, base, bytes));
  return std::shared_ptr<const PeerMemory>(std::move(memory));
}

absl::Status CudaEngine::ReadPeerMemory(const PeerMemory& memory, int64_t offset, int64_t bytes,
                                        void* host_out) {
  const auto* peer = dynamic_cast<const CudaPeerMemory*>(&memory);
  if (peer == nullptr || peer->context() != ctx_.get()) {
    return absl::InvalidArgumentError("the memory is not peer memory of this CUDA engine");
  }
  if (offset < 0 || bytes < 0 || offset > peer->bytes() - bytes) {
    return absl::InvalidArgumentError(absl::StrCat("bytes [", offset, ", +", bytes,
                                                   ") lie outside the peer memory's ",
                                                   peer->bytes(), " bytes"));
  }
  return ctx_->CopyToHost(host_out, peer->base() + offset, bytes, peer->ready());
}

absl::StatusOr<std::unique_ptr<ComputeCall>> CudaEngine::StartCompute(
    std::shared_ptr<const Head> head, ComputeSpec spec, GradInputSink sink) {
  FLCE_RETURN_IF_ERROR(RefuseTwoPassSpec(spec, "CUDA"));
  FLCE_RETURN_IF_ERROR(ctx_->Enter());
  FLCE_ASSIGN_OR_RETURN(
      auto call, CudaComputeCall::Start(this, std::move(head), std::move(spec), std::move(sink)));
  return std::unique_ptr<ComputeCall>(std::move(call));
}

Exec CudaEngine::exec() const {
  Exec e;
  e.cublas = cublas_;
  e.gemm_algos = gemm_algos_.get();
  e.stream = compute_;
  e.health = ctx_->health();
  e.side = side_;
  for (int i = 0; i < 4; ++i) e.events[i] = events_[i];
  return e;
}

absl::StatusOr<char*> CudaEngine::Scratch(int64_t bytes, const char* purpose) {
  if (bytes > workspace_.capacity()) {
    // Growing frees the old buffer: nothing queued may still use it.
    DeviceHealth* health = ctx_->health();
    FLCE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(compute_), health);
  }
  return workspace_.Device(bytes, purpose);
}

absl::StatusOr<std::unique_ptr<CudaEngine::SlotMemory>> CudaEngine::TakeSlotMemory(
    int64_t device_bytes, int64_t pinned_bytes) {
  std::unique_ptr<SlotMemory> memory;
  {
    std::lock_guard<std::mutex> lock(pool_mu_);
    // Prefer a set that is already large enough; else grow any free one.
    auto fits = std::find_if(free_slots_.begin(), free_slots_.end(), [&](const auto& m) {
      return m->device.bytes() >= device_bytes && m->pinned.bytes() >= pinned_bytes;
    });
    if (fits == free_slots_.end() && !free_slots_.empty()) fits = free_slots_.begin();
    if (fits != free_slots_.end()) {
      memory = std::move(*fits);
      free_slots_.erase(fits);
    }
  }
  if (memory == nullptr) memory = std::make_unique<SlotMemory>();
  DeviceHealth* health = ctx_->health();
  if (memory->device.bytes() < device_bytes) {
    workspace_.AddRequestBytes(-memory->device.bytes());
    memory->device.Reset();
    FLCE_ASSIGN_OR_RETURN(memory->device, DeviceBuffer::Allocate(device_bytes, health));
    workspace_.AddRequestBytes(memory->device.bytes());
  }
  if (memory->pinned.bytes() < pinned_bytes) {
    memory->pinned.Reset();
    FLCE_ASSIGN_OR_RETURN(memory->pinned, PinnedBuffer::Allocate(pinned_bytes, health));
  }
  return memory;
}

void CudaEngine::ReturnSlotMemory(std::unique_ptr<SlotMemory> memory) {
  if (memory == nullptr) return;
  std::lock_guard<std::mutex> lock(pool_mu_);
  free_slots_.push_back(std::move(memory));
}

int64_t CudaEngine::PlannedChunkTokens(const Head& head, const ComputeSpec& spec) const {
  const auto* cuda_head = dynamic_cast<const CudaHead*>(&head);
  if (cuda_head == nullptr) return 0;
  absl::StatusOr<Plan> plan = StreamedPlanFor(*cuda_head, spec);
  return plan.ok() && plan->strategy == Strategy::kChunked ? plan->chunk_tokens : 0;
}

absl::StatusOr<Plan> CudaEngine::PlanFor(const CudaHead& head, const PlanRequest& request) const {
  return MakePlan(head.view(), request, workspace_.budget());
}

absl::StatusOr<Plan> CudaEngine::StreamedPlanFor(const CudaHead& head,
                                                 const ComputeSpec& spec) const {
  PlanRequest req = PlanRequestFor(spec);
  req.streaming = true;
  return PlanFor(head, req);
}

absl::Status CudaEngine::RunOnDevice(const CudaHead& head, const Plan& plan,
                                     const DeviceRequest& request) {
  FLCE_RETURN_IF_ERROR(ctx_->Enter());
  std::lock_guard<std::mutex> lock(submit_mu_);
  FLCE_ASSIGN_OR_RETURN(char* scratch, Scratch(plan.scratch_bytes, StrategyName(plan.strategy)));
  FLCE_RETURN_IF_ERROR(RunPlan(exec(), head.view(), plan, request, scratch));
  FLCE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(compute_), ctx_->health());
  return absl::OkStatus();
}

absl::Status CudaEngine::InjectDeviceFaultForTesting() {
  FLCE_RETURN_IF_ERROR(ctx_->Enter());
  return LaunchDeviceFault(compute_, ctx_->health());
}

}  // namespace flce::cuda
