// What the plan files (plan_*.cc) share: how each plan sizes and carves its
// device scratch, hidden in the head's dtype, the cuBLAS backward after the
// row kernels, the split plans' forward, and each plan's entry point for
// RunPlan (plans.cc). Internal to kernels/cuda: the engine sees plans.h.
#ifndef FLCE_KERNELS_CUDA_PLANS_PLAN_PARTS_H_
#define FLCE_KERNELS_CUDA_PLANS_PLAN_PARTS_H_

#include <cstdint>
#include <functional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cuda/ops/gemm.h"
#include "kernels/cuda/ops/split_row_kernels.cuh"
#include "kernels/cuda/plans/plans.h"

namespace flce::cuda::plan_parts {

inline int64_t AlignDown(int64_t v, int64_t a) { return v / a * a; }
inline int64_t AlignUp(int64_t v, int64_t a) { return (v + a - 1) / a * a; }

// Per-token device bytes besides the logits: hidden converted to the head's
// dtype, an fp32 grad_input (when the GEMM cannot write hidden_dtype
// directly, or when splits accumulate), the bias GEMM's ones.
struct TokenBytes {
  int64_t conv = 0;
  int64_t gi32 = 0;
  int64_t ones = 0;
  int64_t rowstate = 0;
  int64_t total() const { return conv + gi32 + ones + rowstate; }
};

struct Scratch {
  float* logits = nullptr;
  void* probs = nullptr;    // naive only
  void* dlogits = nullptr;  // naive only
  void* conv = nullptr;
  float* gi32 = nullptr;
  void* ones = nullptr;
  RowState* state = nullptr;
  RowGrad* grad = nullptr;
};

struct RowScaledScratch {
  float* reference = nullptr;   // M_t
  float* scale = nullptr;       // K_t
  void* x_scaled = nullptr;     // K_t x_t, head dtype
  float* grad_input = nullptr;  // E W, fp32
  int32_t* fallback = nullptr;
  int32_t* tile_counter = nullptr;  // the grad_W GEMM's, beside grad_input
};

struct TileScratch {
  void* exp_dlogits = nullptr;
  TileStats stats;
  // The five partials arrays as one region: dead once the row finish has
  // read them, so the backward may reuse it (grad_input's split slabs).
  void* partials = nullptr;
  int64_t partials_bytes = 0;
  float* target_logit = nullptr;
  RowGrad* grad = nullptr;
  Scratch rest;             // conv, gi32, ones
  RowScaledScratch scaled;  // bf16 heads only
};

TokenBytes PerTokenBytes(const HeadView& head, DType hidden_dtype, bool accumulate_gi);
// Scratch of `rows` tokens, carved in a fixed order by Carve.
int64_t ScratchBytes(int64_t rows, int64_t logits_cols, const TokenBytes& tb, int extra_logits);
Scratch Carve(char* base, int64_t rows, int64_t logits_cols, const TokenBytes& tb,
              const HeadView& head, bool naive, bool split);
// RESOURCE_EXHAUSTED naming what needs how much of --workspace-mb.
absl::Status Exhausted(const char* what, int64_t needed, int64_t budget, const char* hint);

// The vocab_split block a budget affords, from `rows` tokens down: the widest
// split of columns (VocabPolicy-aligned, at most kMaxSplit and `vocab`) beside
// `rows` tokens' scratch, the rows halved (kTokenAlign-aligned) until at least
// kMinSplit columns, or the whole vocabulary, fit. bytes(rows, cols): such a
// block's scratch. Without a fit, `rows` is the last size tried.
struct SplitFit {
  bool fits = false;
  int64_t rows = 0;
  int64_t cols = 0;
};
SplitFit FitVocabSplit(int64_t rows, int64_t vocab, int64_t budget,
                       const std::function<int64_t(int64_t rows, int64_t cols)>& bytes);

// bf16 heads can take the row-scaled backward (row_scaled_backward.cuh).
bool RowScaledCapable(const HeadView& head);
// The logits-stats path's scratch per token, and for `rows` tokens.
int64_t TilePerTokenBytes(const HeadView& head);
int64_t TileScratchBytes(int64_t rows, const HeadView& head, const TokenBytes& tb);
TileScratch CarveTile(char* base, int64_t rows, const HeadView& head, const TokenBytes& tb);
// The partials region of a chunk of `rows` (TileScratch::partials_bytes).
int64_t TilePartialsBytes(int64_t rows, const HeadView& head);
// A plan's switches: the environment's, except that a deterministic request
// keeps grad_W's fixed tile list where FLCE_CUDA_GEMM_TILES=measured (the
// algorithm a trial picks may differ from process to process).
KernelSwitches PlanSwitches(const PlanRequest& req);
// The chunked plan takes the logits-stats GEMM for plain logits (no bias,
// softcap or temperature) on heads and devices it supports.
bool UseTileStats(const HeadView& head, const PlanRequest& req, const KernelSwitches& switches);

// The logits-stats GEMM's and the row kernels' arguments for one chunk of
// the whole head (a vocabulary shard overrides its columns and targets),
// the GEMM's kernel as `switches` choose it.
void TileChunkArgs(const HeadView& head, const DeviceRequest& r, const TileScratch& s,
                   const void* x, const KernelSwitches& switches, LogitsStatsArgs* g,
                   TileRowArgs* t);

Gemm MakeGemm(const Exec& exec, const HeadView& head);
// X in the head's dtype: the request's rows or their conversion into s.conv.
absl::StatusOr<const void*> HeadDtypeHidden(const Exec& exec, const HeadView& head,
                                            const DeviceRequest& r, const Scratch& s);
// Rows [begin, begin + rows) of a request.
DeviceRequest Slice(const DeviceRequest& r, int64_t begin, int64_t rows, int64_t hidden);
bool WantsBackward(const DeviceRequest& r);
// grad_input from dlogits (row stride ld_d elements), grad_W and grad_b.
absl::Status Backward(const Exec& exec, const HeadView& head, const DeviceRequest& r,
                      const Scratch& s, const void* x, const void* dlogits, int64_t ld_d);

// The split kernels' view of one vocabulary split's logits in s.logits.
SplitArgs SplitArgsFor(const HeadView& head, const DeviceRequest& r, const Scratch& s, int64_t col0,
                       int64_t cols);
// A vocab_split or fuse_mn block up to its backward: scratch carved, hidden in
// the head's dtype, the forward over vocabulary splits run (per-row state,
// then RowGrad and outputs).
struct SplitBlock {
  Scratch s;
  const void* x = nullptr;
};
absl::StatusOr<SplitBlock> ForwardSplitBlock(const Exec& exec, const HeadView& head,
                                             const Plan& plan, const DeviceRequest& r,
                                             char* scratch);

// The plans (chunked and separate: RunChunk in plans.h).
absl::Status RunNaive(const Exec& exec, const HeadView& head, const DeviceRequest& r,
                      char* scratch);
absl::Status RunVocabSplitBlock(const Exec& exec, const HeadView& head, const Plan& plan,
                                const DeviceRequest& r, char* scratch);
absl::Status RunFuseMNBlock(const Exec& exec, const HeadView& head, const Plan& plan,
                            const DeviceRequest& r, char* scratch);

}  // namespace flce::cuda::plan_parts

#endif  // FLCE_KERNELS_CUDA_PLANS_PLAN_PARTS_H_
