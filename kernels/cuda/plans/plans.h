// The execution plans (MATH.md's fused linear + cross-entropy over device-
// resident inputs) and the planner that picks one from the shape and the
// workspace budget. The engine's calls and the benchmark both run plans
// through RunPlan / RunChunk, so that what is measured is what is served.
//
//   chunked      token chunks; on Hopper with plain logits, a GEMM with the
//                row statistics in its epilogue writes 2 bytes per logit:
//                bf16 exp(z - M_t) that is dlogits up to a per-row scale
//                (row_scaled_backward.cuh), or, where that cannot serve,
//                fp16 exp(z - m_tile) that a row pass turns into dlogits in
//                place; elsewhere fp32 logits from cuBLAS and one fused row
//                kernel overwriting them with dlogits. cuBLAS does grad_input
//                and grad_W (+= fp32, beta = 1).
//   separate     the same with one chunk of every token: the full (BT x V)
//                logits/dlogits buffer, when it fits the budget.
//   naive        logits, softmax and dlogits each materialised for all
//                tokens, as autograd would: the memory wall.
//   vocab_split  vocabulary splits with an online softmax (O(BT) state), the
//                backward recomputes each split's logits.
//   fuse_mn      stats as vocab_split, then one tile kernel with atomics
//                (never deterministic: such requests run vocab_split).
#ifndef FLCE_KERNELS_CUDA_PLANS_PLANS_H_
#define FLCE_KERNELS_CUDA_PLANS_PLANS_H_

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "core/dtype.h"
#include "kernels/cuda/base/cuda_status.h"
#include "kernels/cuda/base/kernel_choices.h"
#include "kernels/cuda/base/policy.h"
#include "kernels/cuda/base/row_types.h"
#include "kernels/cuda/base/stage_timer.h"
#include "kernels/cuda/ops/gemm_algos.h"
#include "kernels/cuda/ops/sm90/backward_gemm.cuh"
#include "kernels/cuda/ops/sm90/logits_stats_gemm.cuh"
#include "kernels/cuda/ops/tile_stats_kernels.cuh"
#include "kernels/engine.h"

namespace flce::cuda {

struct HeadView {
  DType dtype = DType::kBF16;
  int64_t vocab = 0;
  int64_t padded_vocab = 0;
  int64_t hidden = 0;
  const void* weight = nullptr;  // padded_vocab x hidden, rows >= vocab are 0
  const void* bias = nullptr;    // padded_vocab, or null
};

// One request's (or one chunk's) device-resident data.
struct DeviceRequest {
  int64_t rows = 0;
  DType hidden_dtype = DType::kBF16;
  const void* hidden = nullptr;  // rows x H in hidden_dtype
  RowInputs in;                  // rows entries each
  RowOutputs out;                // rows entries each
  void* grad_input = nullptr;    // rows x H in hidden_dtype, or null
  float* grad_weight = nullptr;  // padded_vocab x H, or null (forward only)
  float* grad_bias = nullptr;    // padded_vocab, or null
  LossParams params;
};

struct Plan {
  Strategy strategy = Strategy::kChunked;
  int64_t chunk_tokens = 0;       // chunked: tokens per chunk; split plans: per token block
  // chunked, rows over the wire: the first and last chunks' tokens, doubling
  // towards chunk_tokens between them (chunk_schedule.h); 0 = none.
  int64_t edge_tokens = 0;
  int64_t split_cols = 0;         // vocab_split / fuse_mn: vocabulary columns per split
  int64_t scratch_bytes = 0;      // device workspace RunPlan needs
  int64_t stream_slot_bytes = 0;  // chunked streaming: per slot (hidden in, grad out, rows)
  int stream_slots = 0;  // chunked streaming: slots the call takes turns on (WireSlots)
  bool tile_stats = false;        // chunked: the logits-stats GEMM path (logits_stats_gemm.cuh)
  // FLCE_CUDA_* as read when the plan was made: every launch of the plan
  // decides its kernels from these (kernel_choices.h; DescribeKernels).
  KernelSwitches switches;
};

// The most upload/download slots a streaming plan asks for.
inline constexpr int kMaxStreamSlots = ChunkPolicy::kWirePacedSlots;

struct PlanRequest {
  Strategy strategy = Strategy::kAuto;
  int64_t num_tokens = 0;
  DType hidden_dtype = DType::kBF16;
  int64_t chunk_tokens = 0;  // caller's hint; 0 = from the budget
  bool deterministic = false;
  bool streaming = true;     // chunked: reserve upload/download slots too (Plan::stream_slots)
  bool plain_logits = true;  // no softcap, temperature 1: the logits-stats GEMM may run
  // Hidden arrives at the wire's pace (ComputeSpec::wire_paced, not under
  // deterministic): chunked plans get small edge chunks (ChunkPolicy).
  bool wire_paced = false;
};

// RESOURCE_EXHAUSTED (needed vs available bytes) when the plan cannot fit the
// budget. fuse_mn with deterministic becomes vocab_split (fuse_mn's atomics
// have no fixed summation order).
absl::StatusOr<Plan> MakePlan(const HeadView& head, const PlanRequest& request,
                              int64_t budget_bytes);

struct Exec {
  cublasHandle_t cublas = nullptr;
  GemmAlgos* gemm_algos = nullptr;  // optional: the backward GEMMs' preferred algorithms
  cudaStream_t stream = nullptr;
  DeviceHealth* health = nullptr;
  // Optional: a second stream and four events that let the chunked plan run
  // the row kernel of one half-chunk beside the GEMMs of the other
  // (FLCE_CUDA_OVERLAP=1). Everything still completes on `stream`.
  cudaStream_t side = nullptr;
  cudaEvent_t events[4] = {nullptr, nullptr, nullptr, nullptr};
  // Optional (benchmarks): the end of each stage is marked here.
  StageTimer* timer = nullptr;
  // The switches of the plan being run: RunPlan and RunChunk set them from
  // their plan (a sharded block from its plan); null = the defaults.
  const KernelSwitches* switches = nullptr;
};

// The switches the launches under exec decide by.
inline const KernelSwitches& SwitchesOf(const Exec& exec) {
  return SwitchesOrDefaults(exec.switches);
}

// exec with plan's switches, for the launches (and reports) of that plan.
inline Exec ExecUnder(const Exec& exec, const Plan& plan) {
  Exec under = exec;
  under.switches = &plan.switches;
  return under;
}

// Closes stage `name` on exec's timer, if it has one.
inline void MarkStage(const Exec& exec, const char* name) {
  if (exec.timer != nullptr) exec.timer->Mark(exec.stream, name);
}

// One chunk (rows <= plan.chunk_tokens) of the chunked plan. scratch holds
// plan.scratch_bytes.
absl::Status RunChunk(const Exec& exec, const HeadView& head, const Plan& plan,
                      const DeviceRequest& request, char* scratch);

// One logits-stats chunk's kernel arguments over the plan's scratch, exactly
// as RunChunk launches them (the benchmark times the stages one by one).
struct TileChunkLaunch {
  const void* x = nullptr;         // the chunk's hidden in the head's dtype
  LogitsStatsArgs gemm;            // the plain variant: fp16 e per tile
  TileRowArgs rows;                // row finish and dlogits pass
  float* row_reference = nullptr;  // the row-scaled backward's M_t (bf16 heads)
  int32_t* fallback = nullptr;     // and its device flag
  // The own grad_input GEMM as the row-scaled path would launch it (slabs,
  // split count); out is null where the head has no row-scaled backward.
  GradInputGemmArgs own_grad_input;
};
absl::StatusOr<TileChunkLaunch> PrepareTileChunk(const Exec& exec, const HeadView& head,
                                                 const Plan& plan, const DeviceRequest& request,
                                                 char* scratch);

// What a chunk `r` of `plan` runs, as "key=value" words (ComputeSummary.
// kernels): logits= (cublas_fp32, stats_cooperative, stats_pingpong128,
// stats_pingpong192[_pairs]), rows= (the row pass: two_pass, cluster,
// [+half_chunk_overlap], tile_finish+dlogits_pass, row_reference), and where
// asked grad_input= (cublas, own_splitsN) and grad_weight= (cublas,
// cublas_preferred_tile, thin_pass, own_pingpong[_pairs|_beside],
// own_cooperative). Decided by the functions the launches decide by.
std::string DescribeChunkKernels(const Exec& exec, const HeadView& head, const Plan& plan,
                                 const DeviceRequest& r);

// The whole request under `plan`.
absl::Status RunPlan(const Exec& exec, const HeadView& head, const Plan& plan,
                     const DeviceRequest& request, char* scratch);

}  // namespace flce::cuda

#endif  // FLCE_KERNELS_CUDA_PLANS_PLANS_H_
