// What every compute call of one CPU engine shares: the thread pool, the
// workspace (a token chunk's logits / dr, its grad_input, per-thread scratch
// rows) and the mutex that lets one chunk at a time use them. The workspace is
// bounded by EngineConfig::workspace_bytes: a chunk's tokens are chosen so
// that chunk x V fits, and nothing of size tokens x V is ever allocated.
#ifndef FLCE_KERNELS_CPU_CPU_CONTEXT_H_
#define FLCE_KERNELS_CPU_CPU_CONTEXT_H_

#include <atomic>
#include <cstdint>
#include <mutex>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/cpu/thread_pool.h"

namespace flce::cpu {

// A chunk of 1024 tokens keeps every GEMM large enough to run near the BLAS's
// peak (M = 1024 or K = 1024) while the logits block stays a few hundred MB
// at most for real vocabularies.
inline constexpr int64_t kDefaultChunkTokens = 1024;

// Where chunk time went since the engine started (milliseconds), for the
// benchmark's breakdown; updated with mu held.
struct PhaseTimes {
  double logits_gemm = 0.0;
  double row_pass = 0.0;
  double grad_input_gemm = 0.0;
  double grad_weight_gemm = 0.0;
  double grad_bias = 0.0;
  int64_t chunks = 0;
};

struct CpuContext {
  explicit CpuContext(int threads_in, int64_t budget_bytes)
      : threads(threads_in), budget(budget_bytes), pool(threads_in) {}

  // Bytes a call with this chunk size needs: the shared buffers plus the
  // call's own pending-rows buffer.
  int64_t BytesFor(int64_t chunk_tokens, int64_t vocab_size, int64_t hidden_size) const;
  // The chunk size for a call: `requested` (> 0) or the default, lowered to
  // what the budget allows. RESOURCE_EXHAUSTED when not even one token fits.
  absl::StatusOr<int64_t> ChooseChunkTokens(int64_t requested, int64_t vocab_size,
                                            int64_t hidden_size) const;
  // Grows the shared buffers to hold a chunk; call with mu held.
  // RESOURCE_EXHAUSTED when the host cannot give the memory.
  absl::Status Reserve(int64_t chunk_tokens, int64_t vocab_size, int64_t hidden_size);
  // Per-call buffers (pending hidden rows) entering and leaving.
  void TrackCallBytes(int64_t delta);
  int64_t peak_bytes() const { return peak.load(); }

  const int threads;
  const int64_t budget;
  ThreadPool pool;

  std::mutex mu;  // one chunk at a time uses the buffers below and the pool
  std::vector<float> logits;      // chunk x V: logits, then dr in place
  std::vector<float> grad_input;  // chunk x H
  std::vector<float> scratch;     // threads x kRowScratchPerVocab x V (row_pass.h)
  PhaseTimes phase_times;

 private:
  void UpdatePeak();
  std::atomic<int64_t> shared_bytes{0};
  std::atomic<int64_t> call_bytes{0};
  std::atomic<int64_t> peak{0};
};

}  // namespace flce::cpu

#endif  // FLCE_KERNELS_CPU_CPU_CONTEXT_H_
