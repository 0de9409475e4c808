// The proto-free engine API: everything the server asks of a backend (CPU or
// CUDA) to keep LM heads resident and run MATH.md's fused linear +
// cross-entropy on them.
//
// Usage:
//   std::unique_ptr<Engine> engine = ...;            // CreateCpuEngine / LoadCudaEngine
//   auto builder = engine->BeginHead({V, H, DType::kBF16, /*has_bias=*/false});
//   (*builder)->WriteWeight(0, bytes, n);             // as the upload streams in
//   std::shared_ptr<const Head> head = *(*builder)->Finish();
//   auto grad = *engine->NewGradBuffer(*head);       // fp32, zeroed
//   ComputeSpec spec = ...; spec.grad_out = grad.get();
//   auto call = *engine->StartCompute(head, spec, sink);
//   call->AddHidden(0, rows, hidden_bytes);           // sink receives grad_input rows
//   ComputeResult result = *call->Finish();
//
// Never materialised by any engine: a (tokens x V) logits tensor, except by
// the GPU strategies "separate" and "naive", which exist to show that wall.
#ifndef FLCE_KERNELS_ENGINE_H_
#define FLCE_KERNELS_ENGINE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/compute_options.h"
#include "core/dtype.h"
#include "core/policy_objective.h"
#include "core/preference_objective.h"
#include "kernels/optimizer.h"

namespace flce {


struct HeadSpec {
  int64_t vocab_size = 0;   // V, the real vocabulary (engines may pad internally)
  int64_t hidden_size = 0;  // H
  DType dtype = DType::kBF16;
  bool has_bias = false;
};

// A resident LM head. Immutable once built (except by its HeadOptimizer's
// Step, see Engine::CreateOptimizer): replacing a head builds a new one, and
// calls in flight keep the old one alive through their shared_ptr.
class Head {
 public:
  virtual ~Head() = default;
  virtual const HeadSpec& spec() const = 0;
  // Bytes the head occupies where it lives (device or host).
  virtual int64_t resident_bytes() const = 0;
  // Elements [begin, begin + count) of the weight (row-major) or the bias, in
  // the head's dtype, into host memory: the values compute calls use.
  virtual absl::Status CopyOut(HeadTensor tensor, int64_t begin, int64_t count,
                               void* host_out) const = 0;
  // The embedding lookup of a head tied to its model's input embedding:
  // weight rows ids[0..n) (each in [0, V)) into host memory as out_dtype
  // (the head's dtype, or fp32 widened exactly), n x H row-major.
  virtual absl::Status GatherRows(const int32_t* ids, int64_t n, DType out_dtype,
                                  void* host_out) const = 0;
};

// Streams a head's weight (and bias) into the engine's memory.
class HeadBuilder {
 public:
  virtual ~HeadBuilder() = default;
  // Bytes in spec().dtype, row-major, at byte_offset into the V x H weight.
  virtual absl::Status WriteWeight(int64_t byte_offset, const void* data, int64_t bytes) = 0;
  // Bytes in spec().dtype at byte_offset into the length-V bias.
  virtual absl::Status WriteBias(int64_t byte_offset, const void* data, int64_t bytes) = 0;
  // FAILED_PRECONDITION unless every byte of weight (and bias) was written.
  virtual absl::StatusOr<std::shared_ptr<const Head>> Finish() = 0;
};

// What GradBuffer::ScaleAndAdd found, element by element.
struct FiniteCheck {
  bool contribution_finite = true;  // every element of scale x this
  bool sum_finite = true;           // every element of base + scale x this
  bool ok() const { return contribution_finite && sum_finite; }
};

// INVALID_ARGUMENT naming the first id outside [0, vocab_size) (and its index).
absl::Status CheckRowIds(const int32_t* ids, int64_t n, int64_t vocab_size);

struct GradNorms {
  double weight_sq = 0.0;
  double bias_sq = 0.0;
};

// An fp32 V x H (+ V bias) gradient accumulator in the engine's memory: a
// session's grad_W, or one call's staged contribution.
class GradBuffer {
 public:
  virtual ~GradBuffer() = default;
  virtual int64_t vocab_size() const = 0;
  virtual int64_t hidden_size() const = 0;
  virtual bool has_bias() const = 0;
  virtual int64_t bytes() const = 0;
  virtual absl::Status Zero() = 0;
  // this += scale * other (same shape).
  virtual absl::Status AddScaled(const GradBuffer& other, float scale) = 0;
  // this = base + scale * this (same shape), and whether the contribution and
  // the sum are finite, found in the same pass. A session lands a call's
  // contribution this way and then swaps the two buffers: no second V x H
  // buffer, and the accumulator is untouched when the sum would not be finite.
  // When the check fails, this buffer's content is unspecified.
  virtual absl::StatusOr<FiniteCheck> ScaleAndAdd(float scale, const GradBuffer& base) = 0;
  // True when every element (weight and bias) is finite.
  virtual absl::StatusOr<bool> AllFinite() const = 0;
  // The tied embedding's gradient: weight row ids[i] += rows[i] (rows: n x H
  // in `dtype`, host memory; ids in [0, V)). With `deterministic` repeated
  // ids add up in the order given, bitwise-repeatable; else in any order.
  virtual absl::Status ScatterAddRows(const int32_t* ids, int64_t n, const void* rows, DType dtype,
                                      bool deterministic) = 0;
  // Sums of squares of the weight's and the bias's elements, accumulated in
  // fp64 in a fixed order (the same buffer gives the same bits every time).
  virtual absl::StatusOr<GradNorms> SquaredNorms() const = 0;
  // Weight rows [row_begin, row_begin + rows) into host memory as fp32 or bf16.
  virtual absl::Status CopyWeightRows(int64_t row_begin, int64_t rows, DType out_dtype,
                                      void* host_out) const = 0;
  // Bias elements [begin, begin + count) into host memory as fp32 or bf16.
  virtual absl::Status CopyBias(int64_t begin, int64_t count, DType out_dtype,
                                void* host_out) const = 0;
};



// Memory of another process that the engine's GPU reads hidden rows from and
// writes grad_input into directly: device memory on the engine's GPU (CUDA
// IPC, Engine::OpenPeerMemory) or shared host memory page-locked for it
// (Engine::RegisterHostMemory).
class PeerMemory {
 public:
  virtual ~PeerMemory() = default;
  virtual int64_t bytes() const = 0;
};

// What the exporting process sends to have its memory opened.
struct PeerMemoryHandle {
  std::string memory_handle;  // cudaIpcMemHandle_t of the allocation's base
  std::string event_handle;   // cudaIpcEventHandle_t the exporter records after writing hidden
  std::string device_uuid;    // the GPU it lives on (EngineInfo::device_uuid's form or "GPU-" + it)
  int64_t bytes = 0;          // how much of the allocation compute calls may use
  std::string key;            // the bytes the exporter wrote at its start (proof of ownership)
};

// What AddHiddenFromPeer found in rows it copied: the same facts the host
// path gets from the bytes themselves.
struct PeerRows {
  int64_t first_non_finite = -1;  // element index into the rows (row * H + column); -1 = none
  uint64_t fingerprint = 0;       // of the rows: kernels/device_fingerprint.h's arithmetic
};

struct ComputeSpec {
  int64_t num_tokens = 0;
  DType hidden_dtype = DType::kBF16;  // of AddHidden's bytes and of grad_input
  std::vector<int32_t> targets;       // num_tokens
  int32_t ignore_index = -100;
  Reduction reduction = Reduction::kMean;
  LossOptions options;
  std::vector<float> token_weights;    // a_t; empty = from the reduction
  std::vector<float> entropy_weights;  // e_t; empty = 0
  // A policy-gradient objective in place of the cross-entropy: the loss of
  // token t is L_t(logp_t), weighted by the objective's w_t (token_weights,
  // label smoothing and z-loss do not combine with it). Engines without it
  // refuse the call (EngineInfo::policy_objectives).
  std::optional<PolicyObjective> policy;
  // A sequence-level preference objective over pairs of responses (DPO, IPO,
  // hinge, SimPO, ORPO): two passes over the rows, the log-probs and then the
  // cross-entropy's gradient weighted by a_t = -dL/dlogp_t. Started through
  // StartComputeCall, which runs both passes on any engine; an engine handed
  // one directly refuses it.
  std::optional<PreferenceObjective> preference;
  OutputSelection outputs;
  Strategy strategy = Strategy::kAuto;
  bool deterministic = false;
  int64_t chunk_tokens = 0;  // 0 = engine's choice
  // Hidden arrives at a network's pace (messages rather than a region): an
  // engine whose chunk waits for all its rows may choose smaller chunks.
  bool wire_paced = false;
  // The caller has checked every row it hands to AddHidden for NaN and Inf
  // (the server does, as the rows arrive), so the engine does not scan them
  // again. Rows read from peer memory are checked by the engine regardless.
  bool hidden_checked = false;
  // Where this call's grad_W (and grad_b) is ADDED, already multiplied by
  // grad_scale. nullptr = forward only (no gradient work at all).
  GradBuffer* grad_out = nullptr;
  // grad_input written into this peer memory (token t at byte
  // grad_input_peer_offset + t * H * hidden dtype size) instead of handed to
  // the sink; its first non-finite element is reported in ComputeResult.
  const PeerMemory* grad_input_peer = nullptr;
  int64_t grad_input_peer_offset = 0;
};

// The contract a ComputeSpec meets on `head` before any engine starts on it,
// the one check every engine (and the server, on the decoded header) runs:
// INVALID_ARGUMENT naming the field, the value and, for per-token fields, the
// first bad token. The wire's narrower ranges are the server's (validation.h).
absl::Status ValidateComputeSpec(const HeadSpec& head, const ComputeSpec& spec);

// Receives grad_input rows [token_offset, token_offset + rows) in the spec's
// hidden_dtype as soon as they are ready. Called from an engine thread; must
// not block for long.
using GradInputSink = std::function<void(int64_t token_offset, int64_t rows, std::string data)>;

struct ComputeResult {
  double loss = 0.0;    // sum_t a_t l_t
  double z_loss = 0.0;  // sum_t a_t s LSE_t^2
  double entropy_sum = 0.0;  // with OutputSelection::entropy only (the GEMM epilogue skips it)
  int64_t n_valid = 0;
  int64_t n_correct = 0;  // with OutputSelection::accuracy only (the argmax costs GEMM epilogue time)
  std::string strategy_used;
  // The kernels the call's chunks ran, in the engine's words (the CUDA
  // engine's: kernels/cuda/plans/plans.h, DescribeChunkKernels); empty where
  // an engine has only one way.
  std::string kernels;
  double engine_ms = 0.0;
  double wait_ms = 0.0;  // time spent waiting for the engine (its workspace) to be free
  // Of the time AddHidden took, how long it waited for the engine to free an
  // upload slot: input held back by the GPU's pace, not the wire's. -1 where
  // an engine does not stream its input through slots (the CUDA engine's
  // chunked calls do).
  double input_wait_ms = -1.0;
  // Filled when asked for in OutputSelection; num_tokens each.
  std::vector<float> per_token_loss;
  std::vector<float> logprob;
  std::vector<float> entropy;
  std::vector<uint8_t> correct;
  // With ComputeSpec::policy: loss is sum_t w_t L_t; these its parts and statistics.
  PolicyStats policy;
  // With ComputeSpec::preference: loss is the objective's; its parts and statistics.
  PreferenceStats preference;
  // With ComputeSpec::preference: the log-prob pass's part of engine_ms.
  double preference_first_pass_ms = 0.0;
  // With ComputeSpec::grad_input_peer: the first non-finite grad_input
  // element (token * H + column), -1 when all are finite.
  int64_t grad_input_first_non_finite = -1;
};

// One request in flight. Destroying it before Finish cancels the call; the
// grad_out buffer's content is then unspecified (the caller discards it).
class ComputeCall {
 public:
  virtual ~ComputeCall() = default;
  // Hidden rows [token_offset, token_offset + rows), host memory, spec's
  // hidden_dtype. Rows may come in any order but must not overlap.
  virtual absl::Status AddHidden(int64_t token_offset, int64_t rows, const void* data) = 0;
  // The same rows read from peer memory at byte_offset (waiting for the
  // exporter's event first). The engine computes on a private copy, so what
  // it reports and what it computes on are the same bytes. Engines without
  // peer memory: FAILED_PRECONDITION.
  virtual absl::StatusOr<PeerRows> AddHiddenFromPeer(int64_t token_offset, int64_t rows,
                                                     const PeerMemory& memory,
                                                     int64_t byte_offset);
  // Waits for all work; every token must have been given exactly once.
  virtual absl::StatusOr<ComputeResult> Finish() = 0;
};

struct EngineInfo {
  std::string name;  // "cpu" or "cuda:<device name>"
  int64_t workspace_budget_bytes = 0;
  int64_t workspace_peak_bytes = 0;  // high-water mark since start
  int64_t device_memory_used = 0;    // 0 where not applicable
  int64_t device_memory_total = 0;
  std::string device_uuid;  // "GPU-" + the UUID nvidia-smi shows; "" for the CPU
  bool policy_objectives = false;  // computes ComputeSpec::policy
};

class Engine {
 public:
  virtual ~Engine() = default;
  virtual EngineInfo info() const = 0;
  virtual absl::StatusOr<std::unique_ptr<HeadBuilder>> BeginHead(const HeadSpec& spec) = 0;
  // A zeroed fp32 accumulator shaped like the head.
  virtual absl::StatusOr<std::unique_ptr<GradBuffer>> NewGradBuffer(const HeadSpec& spec) = 0;
  virtual absl::StatusOr<std::unique_ptr<ComputeCall>> StartCompute(
      std::shared_ptr<const Head> head, ComputeSpec spec, GradInputSink sink) = 0;
  // Optimizer state for `head`, its master initialised from the resident
  // weight (widened to fp32), moments zero, no steps. The state's Step writes
  // the head's weight in place: the one exception to a Head's immutability,
  // allowed only while no compute call uses the head. INVALID_ARGUMENT for a
  // config ValidateOptimizerGroup refuses.
  virtual absl::StatusOr<std::unique_ptr<HeadOptimizer>> CreateOptimizer(
      std::shared_ptr<const Head> head, const OptimizerConfig& config) = 0;
  // Opens device memory another process exported (CUDA IPC). The engine's
  // GPU only (FAILED_PRECONDITION for another GPU or an engine without
  // device memory); PERMISSION_DENIED when its first bytes are not the key.
  virtual absl::StatusOr<std::shared_ptr<const PeerMemory>> OpenPeerMemory(
      const PeerMemoryHandle& handle);
  // Page-locks `bytes` of host memory at `base` (a shared-memory region a
  // client writes) so that compute calls copy hidden from it and grad_input
  // into it by DMA; unlocked when the last holder lets go. `base` must stay
  // mapped until then. Engines without a GPU: FAILED_PRECONDITION.
  virtual absl::StatusOr<std::shared_ptr<const PeerMemory>> RegisterHostMemory(void* base,
                                                                               int64_t bytes);
  // Copies `bytes` at `offset` of memory OpenPeerMemory opened into host
  // memory, once the exporter's event has fired: the small inputs a call
  // takes from a region beside its hidden (its targets). INVALID_ARGUMENT for
  // a range outside it or another engine's memory; engines without a GPU:
  // FAILED_PRECONDITION.
  virtual absl::Status ReadPeerMemory(const PeerMemory& memory, int64_t offset, int64_t bytes,
                                      void* host_out);
  // The token chunk this engine would run a call of `spec` on `head` in,
  // were all its rows given at once (spec.chunk_tokens 0: the engine's
  // choice); 0 where it does not run calls in token chunks. A call split into
  // calls of its own (the pipelined preference call) cuts its pieces in whole
  // chunks of it, so that each piece runs the chunks the whole call would.
  virtual int64_t PlannedChunkTokens(const Head& head, const ComputeSpec& spec) const;
  // False after an unrecoverable (sticky) device error: the process should exit.
  virtual bool healthy() const = 0;
};

// AddHidden's refusals, as every engine words them: rows [offset, offset +
// rows) outside the call's tokens or overlapping rows already given (`given`:
// one flag per token of the call), and a row holding a non-finite value
// (element `bad` of the rows from token `offset`, `hidden` per row).
absl::Status CheckHiddenRowRange(int64_t offset, int64_t rows, const std::vector<uint8_t>& given);
absl::Status NonFiniteHiddenRow(int64_t offset, int64_t bad, int64_t hidden);

// Starts a compute call on `engine`: the engine's own call, or for a
// preference objective the two passes over the engine's calls
// (kernels/preference_call.h; pipelined with the rows' arrival where they
// come at a network's pace: kernels/preference_pipelined_call.h). Every
// caller starts calls this way.
absl::StatusOr<std::unique_ptr<ComputeCall>> StartComputeCall(Engine& engine,
                                                              std::shared_ptr<const Head> head,
                                                              ComputeSpec spec, GradInputSink sink);

// Host bytes that StartComputeCall's two-pass calls keep allocated for the
// next ones (kernels/held_rows.h): memory held with no call in progress.
int64_t HeldRowsKeptBytes();

// FAILED_PRECONDITION for a spec that only StartComputeCall runs (a
// preference objective): what an engine's StartCompute checks first.
absl::Status RefuseTwoPassSpec(const ComputeSpec& spec, const char* engine_name);

struct EngineConfig {
  int64_t workspace_bytes = int64_t{2048} << 20;
  int threads = 0;  // CPU engine threads; 0 = hardware concurrency
  int device_ordinal = 0;
  // More than one: every head's vocabulary is split across these GPUs (CUDA
  // only). An ordinal listed twice puts two shards side by side on one GPU.
  std::vector<int> devices;
  bool all_devices = false;  // every visible GPU (--gpus all), instead of `devices`
};

}  // namespace flce

#endif  // FLCE_KERNELS_ENGINE_H_
