#include "kernels/cuda/engine/compute_call.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "kernels/cuda/base/policy.h"
#include "kernels/cuda/engine/cuda_engine.h"

namespace flce::cuda {

CudaComputeCall::CudaComputeCall(CudaEngine* engine, std::shared_ptr<const CudaHead> head,
                                 ComputeSpec spec, GradInputSink sink)
    : engine_(engine),
      head_(std::move(head)),
      spec_(std::move(spec)),
      rows_(spec_),
      sink_(std::move(sink)) {}

absl::StatusOr<std::unique_ptr<CudaComputeCall>> CudaComputeCall::Start(
    CudaEngine* engine, std::shared_ptr<const Head> head, ComputeSpec spec, GradInputSink sink) {
  auto cuda_head = std::dynamic_pointer_cast<const CudaHead>(head);
  if (cuda_head == nullptr) {
    return absl::InvalidArgumentError("head was not built by the CUDA engine");
  }
  FLCE_RETURN_IF_ERROR(ValidateSpecFor<CudaGradBuffer>(spec, cuda_head->spec(), "CUDA"));
  std::unique_ptr<CudaComputeCall> call(
      new CudaComputeCall(engine, std::move(cuda_head), std::move(spec), std::move(sink)));
  FLCE_RETURN_IF_ERROR(call->Init());
  return call;
}

absl::Status CudaComputeCall::Init() {
  start_time_ = std::chrono::steady_clock::now();
  const HeadSpec& hs = head_->spec();
  hidden_row_bytes_ = hs.hidden_size * DTypeSize(spec_.hidden_dtype);
  params_ = LossParamsFor(spec_, hs.vocab_size);
  // Refusals (budget, determinism) come before waiting for the engine.
  FLCE_ASSIGN_OR_RETURN(plan_, engine_->StreamedPlanFor(*head_, spec_));
  FLCE_RETURN_IF_ERROR(engine_->context()->Enter());
  return plan_.strategy == Strategy::kChunked ? InitStreaming() : InitBuffered();
}

absl::Status CudaComputeCall::InitStreaming() {
  const int64_t c = plan_.chunk_tokens;
  DeviceHealth* health = engine_->context()->health();
  const int64_t pinned_slot = Carver::Round(c * hidden_row_bytes_) * 2 +
                              Carver::Round(kRowInputs * c * 4) + Carver::Round(kRowOutputs * c * 4);
  const int64_t checks_bytes = Carver::Round(2 * sizeof(RowCheckWords));
  const int slots = plan_.stream_slots;
  if (slots < 1 || slots > kMaxStreamSlots) {
    return absl::InternalError(absl::StrCat("a streaming plan with ", slots, " slots"));
  }
  FLCE_ASSIGN_OR_RETURN(slot_memory_, engine_->TakeSlotMemory(
                                          slots * plan_.stream_slot_bytes + checks_bytes,
                                          slots * pinned_slot));
  Carver dc(static_cast<char*>(slot_memory_->device.get()));
  d_checks_ = dc.Take<RowCheckWords>(2);
  Carver hc(static_cast<char*>(slot_memory_->pinned.get()));
  for (int i = 0; i < slots; ++i) {
    Slot& s = slots_[i];
    s.hidden = dc.TakeBytes(c * hidden_row_bytes_);
    s.grad_input = dc.TakeBytes(c * hidden_row_bytes_);
    s.rows_in = dc.TakeBytes(kRowInputs * c * 4);
    s.outputs = dc.Take<float>(kRowOutputs * c);
    s.h_hidden = hc.TakeBytes(c * hidden_row_bytes_);
    s.h_grad_input = hc.TakeBytes(c * hidden_row_bytes_);
    s.h_rows_in = hc.TakeBytes(kRowInputs * c * 4);
    s.h_outputs = hc.Take<float>(kRowOutputs * c);
    for (cudaEvent_t* ev : {&s.uploaded, &s.computed, &s.downloaded}) {
      FLCE_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(ev, cudaEventDisableTiming), health);
    }
  }
  chunk_ends_ = ChunkEnds(plan_, spec_.num_tokens);
  FLCE_RETURN_IF_ERROR(SetGradInputPeer());
  worker_ = std::thread([this] { WorkerLoop(); });
  return absl::OkStatus();
}

absl::Status CudaComputeCall::InitBuffered() {
  const int64_t n = std::max<int64_t>(spec_.num_tokens, 1);
  DeviceHealth* health = engine_->context()->health();
  const int64_t bytes = Carver::Round(n * hidden_row_bytes_) * 2 +
                        Carver::Round(kRowInputs * n * 4) + Carver::Round(kRowOutputs * n * 4) +
                        Carver::Round(2 * sizeof(RowCheckWords)) + 256;
  absl::StatusOr<DeviceBuffer> buffer = DeviceBuffer::Allocate(bytes, health);
  if (!buffer.ok()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "request buffers of ", bytes, " bytes for strategy ", StrategyName(plan_.strategy),
        " could not be allocated: ", buffer.status().message()));
  }
  request_ = std::move(*buffer);
  request_bytes_ = bytes;
  engine_->workspace().AddRequestBytes(bytes);
  Carver c(static_cast<char*>(request_.get()));
  d_hidden_ = c.TakeBytes(n * hidden_row_bytes_);
  d_grad_input_ = c.TakeBytes(n * hidden_row_bytes_);
  d_rows_in_ = c.TakeBytes(kRowInputs * n * 4);
  d_outputs_ = c.Take<float>(kRowOutputs * n);
  d_checks_ = c.Take<RowCheckWords>(2);
  FLCE_RETURN_IF_ERROR(SetGradInputPeer());
  cudaStream_t up = engine_->upload_stream();
  return UploadRowInputs(rows_, d_rows_in_, up, health);
}

CudaComputeCall::~CudaComputeCall() { Teardown(); }

void CudaComputeCall::Teardown() {
  if (worker_.joinable()) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }
  if (engine_->healthy()) {
    // Nothing may still write into the workspace or read the pinned slots.
    cudaStreamSynchronize(engine_->upload_stream());
    cudaStreamSynchronize(engine_->exec().stream);
    cudaStreamSynchronize(engine_->download_stream());
  }
  for (Slot& s : slots_) {
    for (cudaEvent_t* ev : {&s.uploaded, &s.computed, &s.downloaded}) {
      if (*ev != nullptr) cudaEventDestroy(*ev);
      *ev = nullptr;
    }
  }
  if (request_bytes_ > 0) {
    request_.Reset();
    engine_->workspace().AddRequestBytes(-request_bytes_);
    request_bytes_ = 0;
  }
  if (slot_memory_ != nullptr) engine_->ReturnSlotMemory(std::move(slot_memory_));
}

void CudaComputeCall::FailWith(const absl::Status& status) {
  std::lock_guard<std::mutex> lock(mu_);
  if (status_.ok()) status_ = status;
}

absl::Status CudaComputeCall::AddHidden(int64_t token_offset, int64_t rows, const void* data) {
  if (finished_) return absl::FailedPreconditionError("AddHidden after Finish");
  FLCE_RETURN_IF_ERROR(engine_->context()->Enter());
  {
    std::lock_guard<std::mutex> lock(mu_);
    FLCE_RETURN_IF_ERROR(status_);
  }
  FLCE_RETURN_IF_ERROR(rows_.Accept(token_offset, rows, data, head_->spec().hidden_size,
                                    spec_.hidden_dtype));
  if (rows == 0) return absl::OkStatus();
  const char* bytes = static_cast<const char*>(data);
  absl::Status st =
      plan_.strategy == Strategy::kChunked
          ? AddStreaming(token_offset, rows,
                         [&](Slot& slot, int64_t at, int64_t first, int64_t n) -> absl::Status {
                           const int64_t size = n * hidden_row_bytes_;
                           std::memcpy(slot.h_hidden + at, bytes + first * hidden_row_bytes_, size);
                           FLCE_CUDA_RETURN_IF_ERROR(
                               cudaMemcpyAsync(slot.hidden + at, slot.h_hidden + at, size,
                                               cudaMemcpyHostToDevice, engine_->upload_stream()),
                               engine_->context()->health());
                           return absl::OkStatus();
                         })
          : AddBuffered(token_offset, rows, bytes);
  if (!st.ok()) FailWith(st);
  return st;
}

absl::Status CudaComputeCall::SetGradInputPeer() {
  if (spec_.grad_input_peer == nullptr || !spec_.outputs.grad_input) return absl::OkStatus();
  const auto* peer = dynamic_cast<const CudaPeerMemory*>(spec_.grad_input_peer);
  if (peer == nullptr || peer->context() != engine_->context()) {
    return absl::InvalidArgumentError("grad_input_peer is not peer memory of this CUDA engine");
  }
  const int64_t bytes = spec_.num_tokens * hidden_row_bytes_;
  const int64_t at = spec_.grad_input_peer_offset;
  if (at < 0 || at > peer->bytes() - bytes) {
    return absl::InvalidArgumentError(absl::StrCat("grad_input at bytes [", at, ", +", bytes,
                                                   ") lies outside the peer memory's ",
                                                   peer->bytes(), " bytes"));
  }
  grad_peer_ = peer;
  // The grad_input check word, before any work of this call reads it (the
  // upload stream's work precedes every compute and download).
  DeviceHealth* health = engine_->context()->health();
  cudaStream_t up = engine_->upload_stream();
  FLCE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(&d_checks_[1].first_non_finite, 0xff, 8, up), health);
  FLCE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(&d_checks_[1].fingerprint, 0, 8, up), health);
  return absl::OkStatus();
}

absl::StatusOr<PeerRows> CudaComputeCall::AddHiddenFromPeer(int64_t token_offset, int64_t rows,
                                                            const PeerMemory& memory,
                                                            int64_t byte_offset) {
  if (finished_) return absl::FailedPreconditionError("AddHiddenFromPeer after Finish");
  FLCE_RETURN_IF_ERROR(engine_->context()->Enter());
  {
    std::lock_guard<std::mutex> lock(mu_);
    FLCE_RETURN_IF_ERROR(status_);
  }
  const auto* peer = dynamic_cast<const CudaPeerMemory*>(&memory);
  if (peer == nullptr || peer->context() != engine_->context()) {
    return absl::InvalidArgumentError("the memory is not peer memory of this CUDA engine");
  }
  if (rows < 0 || byte_offset < 0 || byte_offset > peer->bytes() - rows * hidden_row_bytes_) {
    return absl::InvalidArgumentError(absl::StrCat("hidden at bytes [", byte_offset, ", +",
                                                   rows * hidden_row_bytes_,
                                                   ") lies outside the peer memory's ",
                                                   peer->bytes(), " bytes"));
  }
  FLCE_RETURN_IF_ERROR(rows_.Accept(token_offset, rows, nullptr, head_->spec().hidden_size,
                                    spec_.hidden_dtype));
  if (rows == 0) return PeerRows{};
  absl::StatusOr<PeerRows> got = AddFromPeer(token_offset, rows, *peer, byte_offset);
  if (!got.ok()) FailWith(got.status());
  return got;
}

absl::StatusOr<PeerRows> CudaComputeCall::AddFromPeer(int64_t offset, int64_t rows,
                                                      const CudaPeerMemory& peer,
                                                      int64_t byte_offset) {
  DeviceHealth* health = engine_->context()->health();
  cudaStream_t up = engine_->upload_stream();
  const int64_t hidden = head_->spec().hidden_size;
  RowCheckWords* words = &d_checks_[0];
  FLCE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(&words->first_non_finite, 0xff, 8, up), health);
  FLCE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(&words->fingerprint, 0, 8, up), health);
  // The exporter recorded it after writing hidden (host memory has none: the
  // client wrote it before sending the call).
  if (peer.ready() != nullptr) {
    FLCE_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(up, peer.ready(), 0), health);
  }
  const char* src = peer.base() + byte_offset;
  // A private copy first: the exporter may write its memory at any time, and
  // the check, the fingerprint and the plan must all see the same bytes.
  auto copy_and_check = [&](char* dst, int64_t first, int64_t n) -> absl::Status {
    FLCE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src + first * hidden_row_bytes_,
                                              n * hidden_row_bytes_, cudaMemcpyDefault, up),
                              health);
    return LaunchCheckRows(spec_.hidden_dtype, dst, n, hidden, offset + first, first * hidden,
                           /*fingerprint=*/true, words, up, health);
  };
  if (plan_.strategy == Strategy::kChunked) {
    FLCE_RETURN_IF_ERROR(AddStreaming(offset, rows,
                                      [&](Slot& slot, int64_t at, int64_t first, int64_t n) {
                                        return copy_and_check(slot.hidden + at, first, n);
                                      }));
  } else {
    FLCE_RETURN_IF_ERROR(copy_and_check(d_hidden_ + offset * hidden_row_bytes_, 0, rows));
  }
  RowCheckWords found;
  FLCE_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(&found, words, sizeof(found), cudaMemcpyDeviceToHost, up), health);
  FLCE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(up), health);
  PeerRows result;
  result.first_non_finite =
      found.first_non_finite == ~0ull ? -1 : static_cast<int64_t>(found.first_non_finite);
  result.fingerprint = found.fingerprint;
  return result;
}

absl::Status CudaComputeCall::WriteGradInputToPeer(const char* grad_input, int64_t begin,
                                                   int64_t rows, cudaStream_t stream) {
  DeviceHealth* health = engine_->context()->health();
  const int64_t hidden = head_->spec().hidden_size;
  FLCE_RETURN_IF_ERROR(LaunchCheckRows(spec_.hidden_dtype, grad_input, rows, hidden, begin,
                                       begin * hidden, /*fingerprint=*/false, &d_checks_[1],
                                       stream, health));
  FLCE_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(grad_peer_->base() + spec_.grad_input_peer_offset + begin * hidden_row_bytes_,
                      grad_input, rows * hidden_row_bytes_, cudaMemcpyDefault, stream),
      health);
  return absl::OkStatus();
}

absl::StatusOr<int64_t> CudaComputeCall::GradInputFirstNonFinite() {
  if (grad_peer_ == nullptr) return -1;
  RowCheckWords found;
  // Every stream of the call has been waited for.
  FLCE_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(&found, &d_checks_[1], sizeof(found), cudaMemcpyDeviceToHost),
      engine_->context()->health());
  return found.first_non_finite == ~0ull ? -1 : static_cast<int64_t>(found.first_non_finite);
}

absl::Status CudaComputeCall::AddBuffered(int64_t offset, int64_t rows, const char* data) {
  DeviceHealth* health = engine_->context()->health();
  cudaStream_t up = engine_->upload_stream();
  FLCE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(d_hidden_ + offset * hidden_row_bytes_, data,
                                            rows * hidden_row_bytes_, cudaMemcpyHostToDevice, up),
                            health);
  // The caller's bytes are only valid during this call.
  FLCE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(up), health);
  return absl::OkStatus();
}

absl::Status CudaComputeCall::WaitForFreeSlot() {
  std::unique_lock<std::mutex> lock(mu_);
  auto free = [this] { return !slots_[current_].busy || !status_.ok(); };
  if (!free()) {
    const auto asked = std::chrono::steady_clock::now();
    cv_.wait(lock, free);
    input_wait_ms_ +=
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - asked)
            .count();
  }
  return status_;
}

absl::Status CudaComputeCall::AddStreaming(int64_t offset, int64_t rows, const FillSlot& fill) {
  int64_t first = 0;
  while (rows > 0) {
    if (pending_rows_ > 0 && offset != pending_begin_ + pending_rows_)
      FLCE_RETURN_IF_ERROR(Flush());
    if (pending_rows_ == 0) {
      FLCE_RETURN_IF_ERROR(WaitForFreeSlot());
      pending_begin_ = offset;
      pending_limit_ = ChunkRowsFrom(chunk_ends_, plan_.chunk_tokens, offset);
    }
    Slot& s = slots_[current_];
    const int64_t n = std::min(rows, pending_limit_ - pending_rows_);
    FLCE_RETURN_IF_ERROR(fill(s, pending_rows_ * hidden_row_bytes_, first, n));
    pending_rows_ += n;
    offset += n;
    first += n;
    rows -= n;
    if (pending_rows_ == pending_limit_) FLCE_RETURN_IF_ERROR(Flush());
  }
  return absl::OkStatus();
}

absl::Status CudaComputeCall::Flush() {
  if (pending_rows_ == 0) return absl::OkStatus();
  DeviceHealth* health = engine_->context()->health();
  const int64_t c = plan_.chunk_tokens;
  Slot& s = slots_[current_];
  s.begin = pending_begin_;
  s.rows = pending_rows_;
  const int64_t rows = s.rows;
  cudaStream_t up = engine_->upload_stream();
  cudaStream_t compute = engine_->exec().stream;
  cudaStream_t down = engine_->download_stream();

  rows_.CopyInputs(s.begin, rows, s.h_rows_in, c);
  FLCE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(s.rows_in, s.h_rows_in, rows_.input_arrays() * c * 4,
                                            cudaMemcpyHostToDevice, up),
                            health);
  FLCE_CUDA_RETURN_IF_ERROR(cudaEventRecord(s.uploaded, up), health);

  auto* grad = static_cast<CudaGradBuffer*>(spec_.grad_out);
  DeviceRequest r;
  r.rows = rows;
  r.hidden_dtype = spec_.hidden_dtype;
  r.hidden = s.hidden;
  r.in = rows_.DeviceInputs(s.rows_in, c);
  r.out = rows_.DeviceOutputs(s.outputs, c, spec_.outputs);
  r.grad_input = spec_.outputs.grad_input ? s.grad_input : nullptr;
  r.grad_weight = grad != nullptr ? grad->weight() : nullptr;
  r.grad_bias = grad != nullptr ? grad->bias() : nullptr;
  r.params = params_;
  kernels_.AddChunk(engine_->exec(), head_->view(), plan_, r);
  {
    std::lock_guard<std::mutex> lock(engine_->submit_mutex());
    FLCE_ASSIGN_OR_RETURN(char* scratch, engine_->Scratch(plan_.scratch_bytes, "chunked plan"));
    FLCE_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(compute, s.uploaded, 0), health);
    FLCE_RETURN_IF_ERROR(RunChunk(engine_->exec(), head_->view(), plan_, r, scratch));
    FLCE_CUDA_RETURN_IF_ERROR(cudaEventRecord(s.computed, compute), health);
  }

  FLCE_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(down, s.computed, 0), health);
  if (spec_.outputs.grad_input && grad_peer_ != nullptr) {
    FLCE_RETURN_IF_ERROR(WriteGradInputToPeer(s.grad_input, s.begin, rows, down));
  } else if (spec_.outputs.grad_input) {
    FLCE_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(s.h_grad_input, s.grad_input, rows * hidden_row_bytes_,
                        cudaMemcpyDeviceToHost, down),
        health);
  }
  FLCE_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(s.h_outputs, s.outputs, rows_.output_arrays() * c * 4,
                      cudaMemcpyDeviceToHost, down),
      health);
  FLCE_CUDA_RETURN_IF_ERROR(cudaEventRecord(s.downloaded, down), health);
  {
    std::lock_guard<std::mutex> lock(mu_);
    s.busy = true;
    jobs_.push_back(current_);
  }
  cv_.notify_all();
  current_ = (current_ + 1) % plan_.stream_slots;
  pending_rows_ = 0;
  return absl::OkStatus();
}

void CudaComputeCall::WorkerLoop() {
  DeviceContext* ctx = engine_->context();
  if (cudaSetDevice(ctx->ordinal()) != cudaSuccess) cudaGetLastError();
  const int64_t c = plan_.chunk_tokens;
  for (;;) {
    int index;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return !jobs_.empty() || stop_; });
      if (jobs_.empty()) return;
      index = jobs_.front();
      jobs_.pop_front();
    }
    Slot& s = slots_[index];
    cudaError_t err = cudaEventSynchronize(s.downloaded);
    absl::Status st = CudaStatus(err, "waiting for a chunk's download", ctx->health());
    bool deliver = false;
    if (st.ok()) {
      rows_.Store(s.h_outputs, c, s.begin, s.rows);
      if (spec_.outputs.grad_input && grad_peer_ == nullptr) {
        std::lock_guard<std::mutex> lock(mu_);
        deliver = !stop_ && status_.ok();
      }
    }
    // The sink runs before the slot is released, so that Finish (which waits
    // for free slots) returns only after every row was delivered. Pieces of a
    // large chunk go one by one: the transport sends the first while the next
    // is copied out of the slot.
    if (deliver && sink_) {
      const int64_t piece = std::max<int64_t>(
          1, ChunkPolicy::kGradInputPieceBytes / std::max<int64_t>(hidden_row_bytes_, 1));
      for (int64_t at = 0; at < s.rows; at += piece) {
        const int64_t rows = std::min(piece, s.rows - at);
        sink_(s.begin + at, rows,
              std::string(s.h_grad_input + at * hidden_row_bytes_, rows * hidden_row_bytes_));
      }
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!st.ok() && status_.ok()) status_ = st;
      s.busy = false;
    }
    cv_.notify_all();
  }
}

absl::Status CudaComputeCall::WaitIdle() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return jobs_.empty() && !AnySlotBusy(); });
  return status_;
}

bool CudaComputeCall::AnySlotBusy() const {
  return std::any_of(std::begin(slots_), std::end(slots_), [](const Slot& s) { return s.busy; });
}

absl::Status CudaComputeCall::FinishBuffered() {
  DeviceHealth* health = engine_->context()->health();
  const int64_t n = spec_.num_tokens;
  if (n == 0) return absl::OkStatus();
  auto* grad = static_cast<CudaGradBuffer*>(spec_.grad_out);
  DeviceRequest r;
  r.rows = n;
  r.hidden_dtype = spec_.hidden_dtype;
  r.hidden = d_hidden_;
  r.in = rows_.DeviceInputs(d_rows_in_, n);
  r.out = rows_.DeviceOutputs(d_outputs_, n, spec_.outputs);
  r.grad_input = spec_.outputs.grad_input ? d_grad_input_ : nullptr;
  r.grad_weight = grad != nullptr ? grad->weight() : nullptr;
  r.grad_bias = grad != nullptr ? grad->bias() : nullptr;
  r.params = params_;
  cudaStream_t compute = engine_->exec().stream;
  kernels_.AddRequest(engine_->exec(), head_->view(), plan_, r);
  {
    std::lock_guard<std::mutex> lock(engine_->submit_mutex());
    FLCE_ASSIGN_OR_RETURN(char* scratch,
                          engine_->Scratch(plan_.scratch_bytes, StrategyName(plan_.strategy)));
    FLCE_RETURN_IF_ERROR(RunPlan(engine_->exec(), head_->view(), plan_, r, scratch));
    // Later calls may reuse the scratch as soon as the lock is released: the
    // compute stream orders their work after this one's.
  }
  FLCE_RETURN_IF_ERROR(DownloadRowOutputs(d_outputs_, n, compute, health, rows_));
  if (spec_.outputs.grad_input && grad_peer_ != nullptr) {
    FLCE_RETURN_IF_ERROR(WriteGradInputToPeer(d_grad_input_, 0, n, compute));
  } else if (spec_.outputs.grad_input) {
    FLCE_RETURN_IF_ERROR(SinkGradInput(d_grad_input_, n, hidden_row_bytes_, sink_, compute, health));
  }
  return absl::OkStatus();
}

absl::StatusOr<ComputeResult> CudaComputeCall::Finish() {
  if (finished_) return absl::FailedPreconditionError("Finish called twice");
  finished_ = true;
  absl::Status st = [&]() -> absl::Status {
    FLCE_RETURN_IF_ERROR(engine_->context()->Enter());
    {
      std::lock_guard<std::mutex> lock(mu_);
      FLCE_RETURN_IF_ERROR(status_);
    }
    FLCE_RETURN_IF_ERROR(rows_.CheckAllGiven());
    if (plan_.strategy == Strategy::kChunked) {
      FLCE_RETURN_IF_ERROR(Flush());
      FLCE_RETURN_IF_ERROR(WaitIdle());
    } else {
      FLCE_RETURN_IF_ERROR(FinishBuffered());
    }
    // grad_W / grad_b land on the compute stream after the last download's
    // dependency: wait for them too.
    FLCE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(engine_->exec().stream),
                              engine_->context()->health());
    FLCE_ASSIGN_OR_RETURN(grad_input_first_non_finite_, GradInputFirstNonFinite());
    return absl::OkStatus();
  }();
  if (!st.ok()) FailWith(st);
  Teardown();
  if (!st.ok()) return st;

  ComputeResult result;
  rows_.FillResult(spec_.outputs, result);
  result.grad_input_first_non_finite = grad_input_first_non_finite_;
  result.strategy_used = StrategyName(plan_.strategy);
  result.kernels = kernels_.Text();
  if (plan_.strategy == Strategy::kChunked) result.input_wait_ms = input_wait_ms_;
  result.engine_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start_time_)
          .count();
  return result;
}

}  // namespace flce::cuda
