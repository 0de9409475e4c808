// flce::Engine on one CUDA device. Heads live in device memory in their
// dtype, V padded to 128; compute calls run a plan (plans.h) on the engine's
// compute stream with one workspace, so calls are serialised: StartCompute
// waits until the call in flight has finished or been destroyed.
//
// Usage (normally through LoadCudaEngine and the flce::Engine interface):
//   auto engine = *CudaEngine::Create(config);
//   auto head = ...BeginHead / WriteWeight / Finish...;
//   auto call = *engine->StartCompute(head, spec, sink);
#ifndef FLCE_KERNELS_CUDA_CUDA_ENGINE_H_
#define FLCE_KERNELS_CUDA_CUDA_ENGINE_H_

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <condition_variable>
#include <memory>
#include <mutex>

#include "absl/status/statusor.h"
#include "kernels/cuda/device_memory.h"
#include "kernels/cuda/device_objects.h"
#include "kernels/cuda/plans.h"
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
  bool healthy() const override;

  // Runs `plan` over device-resident inputs on the compute stream and waits
  // (benchmarks, tests). Takes the compute lock.
  absl::Status RunOnDevice(const CudaHead& head, const Plan& plan, const DeviceRequest& request);
  absl::StatusOr<Plan> PlanFor(const CudaHead& head, const PlanRequest& request) const;
  cudaStream_t compute_stream() const { return compute_; }
  // Corrupts the context on purpose (an illegal address): tests of the sticky
  // error path only.
  absl::Status InjectDeviceFaultForTesting();

  // For CudaComputeCall.
  DeviceContext* context() const { return ctx_.get(); }
  Workspace& workspace() { return workspace_; }
  Exec exec() const;
  cudaStream_t upload_stream() const { return upload_; }
  cudaStream_t download_stream() const { return download_; }
  void AcquireCompute();
  void ReleaseCompute();

 private:
  CudaEngine(std::shared_ptr<DeviceContext> ctx, int64_t budget);
  std::shared_ptr<DeviceContext> ctx_;
  Workspace workspace_;
  cublasHandle_t cublas_ = nullptr;
  cudaStream_t compute_ = nullptr;
  cudaStream_t upload_ = nullptr;
  cudaStream_t download_ = nullptr;
  std::mutex busy_mu_;
  std::condition_variable busy_cv_;
  bool busy_ = false;
};

}  // namespace flce::cuda

#endif  // FLCE_KERNELS_CUDA_CUDA_ENGINE_H_
