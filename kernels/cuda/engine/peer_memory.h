// Device memory another process on this host exported with CUDA IPC, opened
// in the engine's context (Engine::OpenPeerMemory), with the exporter's
// interprocess event that says its hidden rows are written; or a shared host
// region page-locked for the GPU (Engine::RegisterHostMemory: the client has
// finished writing before it sends the call, so there is no event). Closed
// (unlocked) when the last holder (the server's region table, calls in
// flight) lets go.
#ifndef FLCE_KERNELS_CUDA_ENGINE_PEER_MEMORY_H_
#define FLCE_KERNELS_CUDA_ENGINE_PEER_MEMORY_H_

#include <cuda_runtime.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "kernels/cuda/engine/cuda_grad_buffer.h"
#include "kernels/cuda/engine/cuda_head.h"
#include "kernels/cuda/engine/device_context.h"
#include "kernels/engine.h"

namespace flce::cuda {

class CudaPeerMemory : public PeerMemory {
 public:
  // INVALID_ARGUMENT for malformed handles or a size beyond the allocation,
  // FAILED_PRECONDITION for memory on another GPU, PERMISSION_DENIED when the
  // first bytes are not the key.
  static absl::StatusOr<std::shared_ptr<const CudaPeerMemory>> Open(
      std::shared_ptr<DeviceContext> ctx, const PeerMemoryHandle& handle);
  // INVALID_ARGUMENT when cudaHostRegister refuses the range.
  static absl::StatusOr<std::shared_ptr<const CudaPeerMemory>> RegisterHost(
      std::shared_ptr<DeviceContext> ctx, void* base, int64_t bytes);
  ~CudaPeerMemory() override;
  CudaPeerMemory(const CudaPeerMemory&) = delete;
  CudaPeerMemory& operator=(const CudaPeerMemory&) = delete;

  int64_t bytes() const override { return bytes_; }
  // A device pointer (CUDA IPC) or a page-locked host one (UVA: either is a
  // cudaMemcpyDefault operand).
  char* base() const { return base_; }
  // Recorded by the exporter once hidden is written; compute waits for it.
  // Null for host memory.
  cudaEvent_t ready() const { return ready_; }
  const DeviceContext* context() const { return ctx_.get(); }

 private:
  explicit CudaPeerMemory(std::shared_ptr<DeviceContext> ctx) : ctx_(std::move(ctx)) {}
  std::shared_ptr<DeviceContext> ctx_;
  char* base_ = nullptr;
  cudaEvent_t ready_ = nullptr;
  int64_t bytes_ = 0;
  bool host_ = false;
};

// A device UUID reduced to 32 lowercase hex digits ("GPU-" and dashes
// dropped), so that nvidia-smi's and torch's spellings compare equal.
std::string CanonicalDeviceUuid(const std::string& uuid);

}  // namespace flce::cuda

#endif  // FLCE_KERNELS_CUDA_ENGINE_PEER_MEMORY_H_
