// One compute call on the CUDA engine.
//
// chunked (the default): AddHidden copies rows into pinned staging and
// starts their upload on the upload stream, then returns. Consecutive rows
// are gathered into chunks as chunk_schedule.h places them; a full chunk (or
// a gap, or Finish) is computed on the compute stream once its upload event fired,
// and its grad_input and per-row outputs are downloaded on the download
// stream. A worker thread waits for each download event and hands the rows
// to the sink (never from a CUDA callback). The plan's slots (two, three for
// a wire-paced call) take turns, so the upload of chunk i+1, the compute of
// chunk i and the download of chunk i-1 overlap.
//
// Other strategies keep the request's hidden rows on the device (request
// buffers, counted in the engine's peak) and compute at Finish.
#ifndef FLCE_KERNELS_CUDA_ENGINE_COMPUTE_CALL_H_
#define FLCE_KERNELS_CUDA_ENGINE_COMPUTE_CALL_H_

#include <cuda_runtime.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/cuda/base/device_memory.h"
#include "kernels/cuda/engine/call_rows.h"
#include "kernels/cuda/engine/cuda_engine.h"
#include "kernels/cuda/engine/cuda_grad_buffer.h"
#include "kernels/cuda/engine/cuda_head.h"
#include "kernels/cuda/engine/device_context.h"
#include "kernels/cuda/engine/peer_memory.h"
#include "kernels/cuda/ops/peer_row_kernels.cuh"
#include "kernels/cuda/plans/chunk_schedule.h"
#include "kernels/cuda/plans/kernel_report.h"
#include "kernels/cuda/plans/plans.h"
#include "kernels/engine.h"

namespace flce::cuda {

class CudaComputeCall : public ComputeCall {
 public:
  static absl::StatusOr<std::unique_ptr<CudaComputeCall>> Start(CudaEngine* engine,
                                                                std::shared_ptr<const Head> head,
                                                                ComputeSpec spec,
                                                                GradInputSink sink);
  ~CudaComputeCall() override;

  absl::Status AddHidden(int64_t token_offset, int64_t rows, const void* data) override;
  absl::StatusOr<PeerRows> AddHiddenFromPeer(int64_t token_offset, int64_t rows,
                                             const PeerMemory& memory,
                                             int64_t byte_offset) override;
  absl::StatusOr<ComputeResult> Finish() override;

 private:
  struct Slot {
    // Device.
    char* hidden = nullptr;
    char* grad_input = nullptr;
    char* rows_in = nullptr;   // CallRows' input block, stride chunk
    float* outputs = nullptr;  // CallRows' output block, stride chunk
    // Pinned host.
    char* h_hidden = nullptr;
    char* h_grad_input = nullptr;
    char* h_rows_in = nullptr;
    float* h_outputs = nullptr;
    cudaEvent_t uploaded = nullptr;
    cudaEvent_t computed = nullptr;
    cudaEvent_t downloaded = nullptr;
    int64_t begin = 0;
    int64_t rows = 0;
    bool busy = false;
  };

  CudaComputeCall(CudaEngine* engine, std::shared_ptr<const CudaHead> head, ComputeSpec spec,
                  GradInputSink sink);
  absl::Status Init();
  absl::Status InitStreaming();
  absl::Status InitBuffered();
  // Puts input rows [first, first + n) (counted from the start of the piece
  // being added) at byte `at` of the slot's device and pinned hidden.
  using FillSlot = std::function<absl::Status(Slot& slot, int64_t at, int64_t first, int64_t n)>;
  absl::Status AddStreaming(int64_t offset, int64_t rows, const FillSlot& fill);
  absl::Status AddBuffered(int64_t offset, int64_t rows, const char* data);
  absl::StatusOr<PeerRows> AddFromPeer(int64_t offset, int64_t rows, const CudaPeerMemory& peer,
                                       int64_t byte_offset);
  absl::Status SetGradInputPeer();
  // Copies grad_input rows to the peer memory after checking them, on `stream`.
  absl::Status WriteGradInputToPeer(const char* grad_input, int64_t begin, int64_t rows,
                                    cudaStream_t stream);
  absl::StatusOr<int64_t> GradInputFirstNonFinite();
  absl::Status WaitForFreeSlot();
  bool AnySlotBusy() const;  // under mu_
  absl::Status Flush();
  absl::Status WaitIdle();
  absl::Status FinishBuffered();
  void WorkerLoop();
  void FailWith(const absl::Status& status);
  void Teardown();

  CudaEngine* engine_;
  std::shared_ptr<const CudaHead> head_;
  ComputeSpec spec_;
  CallRows rows_;  // host copies of the per-token inputs and outputs
  GradInputSink sink_;
  Plan plan_;
  KernelReport kernels_;
  LossParams params_;
  int64_t hidden_row_bytes_ = 0;
  bool finished_ = false;
  std::chrono::steady_clock::time_point start_time_;
  double engine_ms_ = 0.0;
  double input_wait_ms_ = 0.0;  // WaitForFreeSlot's waits (ComputeResult::input_wait_ms)


  // Streaming (chunked).
  std::unique_ptr<CudaEngine::SlotMemory> slot_memory_;
  Slot slots_[kMaxStreamSlots];  // the first plan_.stream_slots are used
  std::vector<int64_t> chunk_ends_;  // ChunkEnds of the plan and the call's rows
  int current_ = 0;
  int64_t pending_begin_ = 0;
  int64_t pending_rows_ = 0;
  int64_t pending_limit_ = 0;  // rows the pending chunk may take
  std::mutex mu_;  // guards slots' busy flags, jobs_, status_, stop_
  std::condition_variable cv_;
  std::deque<int> jobs_;
  bool stop_ = false;
  absl::Status status_;
  std::thread worker_;

  // Buffered (other strategies).
  DeviceBuffer request_;
  int64_t request_bytes_ = 0;
  char* d_hidden_ = nullptr;
  char* d_grad_input_ = nullptr;
  char* d_rows_in_ = nullptr;
  float* d_outputs_ = nullptr;

  // CUDA IPC: [0] hidden rows read from peer memory, [1] grad_input written to it.
  RowCheckWords* d_checks_ = nullptr;
  const CudaPeerMemory* grad_peer_ = nullptr;
  int64_t grad_input_first_non_finite_ = -1;
};

}  // namespace flce::cuda

#endif  // FLCE_KERNELS_CUDA_ENGINE_COMPUTE_CALL_H_
