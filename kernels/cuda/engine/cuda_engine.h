// flce::Engine on one CUDA device. Heads live in device memory in their
// dtype, V padded to 128; compute calls run a plan (plans.h) on the engine's
// one compute stream with one shared scratch workspace, so the GPU work of
// concurrent calls is serialised (submissions take a mutex, chunk by chunk).
// Each live call also holds a set of upload/download slots from a grow-only
// pool: after the first calls no memory is allocated per request.
//
// Usage (normally through LoadCudaEngine and the flce::Engine interface):
//   auto engine = *CudaEngine::Create(config);
//   auto head = ...BeginHead / WriteWeight / Finish...;
//   auto call = *engine->StartCompute(head, spec, sink);
#ifndef FLCE_KERNELS_CUDA_ENGINE_CUDA_ENGINE_H_
#define FLCE_KERNELS_CUDA_ENGINE_CUDA_ENGINE_H_

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <condition_variable>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/cuda/base/device_memory.h"
#include "kernels/cuda/engine/cuda_grad_buffer.h"
#include "kernels/cuda/engine/cuda_head.h"
#include "kernels/cuda/engine/device_context.h"
#include "kernels/cuda/plans/plans.h"
#include "kernels/engine.h"

namespace flce::cuda {

class CudaEngine : public Engine {
 public:
  static absl::StatusOr<std::unique_ptr<CudaEngine>> Create(const EngineConfig& config);
  ~CudaEngine() override;

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
  absl::Status ReadPeerMemory(const PeerMemory& memory, int64_t offset, int64_t bytes,
                              void* host_out) override;
  int64_t PlannedChunkTokens(const Head& head, const ComputeSpec& spec) const override;
  bool healthy() const override;

  // Runs `plan` over device-resident inputs on the compute stream and waits
  // (benchmarks, tests). Takes the compute lock.
  absl::Status RunOnDevice(const CudaHead& head, const Plan& plan, const DeviceRequest& request);
  absl::StatusOr<Plan> PlanFor(const CudaHead& head, const PlanRequest& request) const;
  // The plan a compute call of `spec` streams its rows through (CudaComputeCall's,
  // and the chunk PlannedChunkTokens reports).
  absl::StatusOr<Plan> StreamedPlanFor(const CudaHead& head, const ComputeSpec& spec) const;
  cudaStream_t compute_stream() const { return compute_; }
  // Corrupts the context on purpose (an illegal address): tests of the sticky
  // error path only.
  absl::Status InjectDeviceFaultForTesting();

  // For CudaComputeCall.
  DeviceContext* context() const { return ctx_.get(); }
  std::shared_ptr<DeviceContext> shared_context() const { return ctx_; }
  Workspace& workspace() { return workspace_; }
  Exec exec() const;
  cudaStream_t upload_stream() const { return upload_; }
  cudaStream_t download_stream() const { return download_; }
  // Held while a call enqueues GPU work that uses the shared scratch.
  std::mutex& submit_mutex() { return submit_mu_; }
  // The scratch workspace (grow-only up to the budget); submit_mutex held.
  absl::StatusOr<char*> Scratch(int64_t bytes, const char* purpose);

  // Device + pinned memory of one call's upload/download slots.
  struct SlotMemory {
    DeviceBuffer device;
    PinnedBuffer pinned;
  };
  absl::StatusOr<std::unique_ptr<SlotMemory>> TakeSlotMemory(int64_t device_bytes,
                                                             int64_t pinned_bytes);
  void ReturnSlotMemory(std::unique_ptr<SlotMemory> memory);

 private:
  CudaEngine(std::shared_ptr<DeviceContext> ctx, int64_t budget);
  std::shared_ptr<DeviceContext> ctx_;
  Workspace workspace_;
  cublasHandle_t cublas_ = nullptr;
  std::unique_ptr<GemmAlgos> gemm_algos_;
  cudaStream_t compute_ = nullptr;
  cudaStream_t upload_ = nullptr;
  cudaStream_t download_ = nullptr;
  cudaStream_t side_ = nullptr;
  cudaEvent_t events_[4] = {nullptr, nullptr, nullptr, nullptr};
  std::mutex submit_mu_;
  std::mutex pool_mu_;
  std::vector<std::unique_ptr<SlotMemory>> free_slots_;
};

}  // namespace flce::cuda

#endif  // FLCE_KERNELS_CUDA_ENGINE_CUDA_ENGINE_H_
