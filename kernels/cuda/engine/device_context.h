// The CUDA engine's device context: the GPU, its streams, pinned staging, the
// health flag, the spare gradient memory, and the small device operations
// (copies, finiteness checks, sums of squares, row gathers and scatters) that
// heads and gradient buffers run through it.
#ifndef FLCE_KERNELS_CUDA_ENGINE_DEVICE_CONTEXT_H_
#define FLCE_KERNELS_CUDA_ENGINE_DEVICE_CONTEXT_H_

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/cuda/base/cuda_status.h"
#include "kernels/cuda/base/device_memory.h"
#include "kernels/cuda/plans/plans.h"
#include "kernels/engine.h"

namespace flce::cuda {

// Shared by the engine and everything it hands out, so that a head or a
// gradient buffer outliving the engine still frees its memory safely.
class DeviceContext {
 public:
  static absl::StatusOr<std::shared_ptr<DeviceContext>> Create(int ordinal);
  ~DeviceContext();

  absl::Status Enter();  // health check + cudaSetDevice on this thread
  DeviceHealth* health() { return &health_; }
  const std::string& name() const { return name_; }
  // "GPU-" + the device's UUID, as nvidia-smi writes it.
  const std::string& uuid() const { return uuid_; }
  int ordinal() const { return ordinal_; }

  // Copies through the pinned staging buffer on the auxiliary stream, and
  // waits. Serialised on one mutex.
  absl::Status CopyToDevice(void* dst, const void* src, int64_t bytes);
  // `after`: an event (another process's, CUDA IPC) the copy waits for first.
  absl::Status CopyToHost(void* dst, const void* src, int64_t bytes, cudaEvent_t after = nullptr);
  absl::Status Memset(void* dst, int value, int64_t bytes);
  absl::Status Axpy(float alpha, const float* x, float* y, int64_t count);
  // [offset, offset + count) element ranges of a buffer.
  using Ranges = std::vector<std::pair<int64_t, int64_t>>;
  // inout = base + scale * inout over `ranges`; bit 0 of the result: a
  // contribution was not finite, bit 1: a sum was not.
  absl::StatusOr<unsigned> ScaleAddChecked(float scale, const float* base, float* inout,
                                           const Ranges& ranges);
  absl::StatusOr<bool> AllFinite(const float* x, const Ranges& ranges);
  // The tied embedding: weight rows by host ids into host memory, and
  // gradient rows from host memory scatter-added into grad; in pieces through
  // the staging buffer (embedding_kernels.cuh).
  absl::Status GatherRows(const void* weight, DType weight_dtype, int64_t hidden,
                          const int32_t* ids, int64_t n, DType out_dtype, void* host_out);
  absl::Status ScatterAddRows(float* grad, int64_t hidden, const int32_t* ids, int64_t n,
                              const void* host_rows, DType rows_dtype, bool deterministic);
  // fp64 sums of squares of x over each range, each in a fixed order.
  absl::StatusOr<std::vector<double>> SumsOfSquares(const float* x, const Ranges& ranges);
  // Runs `launch` on the auxiliary stream with the flag word zeroed, waits,
  // and returns the flags the launched kernels set.
  using FlaggedLaunch = std::function<absl::Status(cudaStream_t stream, unsigned* flags)>;
  absl::StatusOr<unsigned> RunFlagged(const FlaggedLaunch& launch);

  // Gradient buffers are V x H fp32 and come and go with every compute call
  // (staging) and landing (a session's accumulator is swapped): the memory of
  // a destroyed one is kept for the next of the same size, so that neither
  // cudaMalloc nor cudaFree (which waits for the whole device, other calls'
  // kernels included) runs per call. Every engine operation on a gradient
  // buffer has finished when it is destroyed (they all wait), so the memory
  // is idle when kept. At most kSpareGradBuffers; all given back when
  // cudaMalloc runs out of memory (DeviceMemory::Reclaim).
  // Kept memory is zeroed on the auxiliary stream as it is kept, without
  // waiting, so that a new buffer (every compute call's staging) costs no
  // memset on the call's path: TakeGradMemory waits for that zeroing and
  // says whether the memory it returns is zero.
  static constexpr int kSpareGradBuffers = 2;
  struct GradMemory {
    DeviceBuffer memory;
    bool zeroed = false;
  };
  absl::StatusOr<GradMemory> TakeGradMemory(int64_t bytes);
  void KeepGradMemory(DeviceBuffer memory);
  int spare_grad_buffers() const;

 private:
  DeviceContext() = default;
  // The flag word, copied back and waited for; aux_mu_ held.
  absl::StatusOr<unsigned> ReadFlagsLocked();
  int ordinal_ = 0;
  std::string name_;
  std::string uuid_;
  DeviceHealth health_;
  std::mutex aux_mu_;
  cudaStream_t aux_ = nullptr;
  PinnedBuffer staging_;
  DeviceBuffer flags_;    // one word the finiteness checks OR into
  DeviceBuffer sums_;     // the sum of squares' partials, then its results
  DeviceBuffer scratch_;  // a staging buffer's worth of device memory (ids and rows)
  mutable std::mutex spare_mu_;
  std::vector<GradMemory> spare_grads_;
};

}  // namespace flce::cuda

#endif  // FLCE_KERNELS_CUDA_ENGINE_DEVICE_CONTEXT_H_
