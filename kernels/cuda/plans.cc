#include "kernels/cuda/plans.h"

#include <algorithm>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cluster_row_kernel.cuh"
#include "kernels/cuda/device_memory.h"
#include "kernels/cuda/elementwise_kernels.cuh"
#include "kernels/cuda/fuse_mn_kernel.cuh"
#include "kernels/cuda/fused_row_kernel.cuh"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/logits_stats_gemm.cuh"
#include "kernels/cuda/policy.h"
#include "kernels/cuda/row_scaled_backward.cuh"
#include "kernels/cuda/split_row_kernels.cuh"
#include "kernels/cuda/tile_stats_kernels.cuh"
#include "kernels/status_macros.h"

namespace flce::cuda {
namespace {

constexpr bool kClusterRowsByDefault = false;

int64_t AlignDown(int64_t v, int64_t a) { return v / a * a; }
int64_t AlignUp(int64_t v, int64_t a) { return (v + a - 1) / a * a; }

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

TokenBytes PerTokenBytes(const HeadView& head, DType hidden_dtype, bool accumulate_gi) {
  TokenBytes b;
  const bool convert = hidden_dtype != head.dtype;
  b.conv = convert ? head.hidden * DTypeSize(head.dtype) : 0;
  b.gi32 = (convert || accumulate_gi) ? head.hidden * 4 : 0;
  b.ones = DTypeSize(head.dtype);
  return b;
}

// Scratch of `rows` tokens, carved in a fixed order by Carve below.
int64_t ScratchBytes(int64_t rows, int64_t logits_cols, const TokenBytes& tb, int extra_logits) {
  int64_t bytes = Carver::Round(rows * logits_cols * 4) * (1 + extra_logits);
  bytes += Carver::Round(rows * tb.conv) + Carver::Round(rows * tb.gi32) +
           Carver::Round(rows * tb.ones) + Carver::Round(rows * tb.rowstate);
  return bytes + 4096;
}

absl::Status Exhausted(const char* what, int64_t needed, int64_t budget, const char* hint) {
  return absl::ResourceExhaustedError(absl::StrCat(
      what, " needs ", needed, " bytes (", needed >> 20, " MiB) of device workspace; ", budget,
      " bytes (", budget >> 20, " MiB) are available (--workspace-mb). ", hint));
}

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

Scratch Carve(char* base, int64_t rows, int64_t logits_cols, const TokenBytes& tb,
              const HeadView& head, bool naive, bool split) {
  Carver c(base);
  Scratch s;
  s.logits = c.Take<float>(rows * logits_cols);
  if (naive) {
    s.probs = c.Take<float>(rows * logits_cols);
    s.dlogits = c.TakeBytes(rows * logits_cols * DTypeSize(head.dtype));
  }
  if (tb.conv) s.conv = c.TakeBytes(rows * tb.conv);
  if (tb.gi32) s.gi32 = c.Take<float>(rows * head.hidden);
  s.ones = c.TakeBytes(rows * tb.ones);
  if (split) {
    s.state = c.Take<RowState>(rows);
    s.grad = c.Take<RowGrad>(rows);
  }
  return s;
}

// bf16 heads can take the row-scaled backward (row_scaled_backward.cuh).
bool RowScaledCapable(const HeadView& head) { return head.dtype == DType::kBF16; }

// Its scratch per token: M_t and K_t, the scaled hidden row (head dtype) and
// the unscaled fp32 grad_input row.
int64_t RowScaledPerTokenBytes(const HeadView& head) {
  return RowScaledCapable(head) ? 4 + 4 + head.hidden * 2 + head.hidden * 4 : 0;
}

// The logits-stats path's scratch: fp16 e (then dlogits) per logit, five
// partials per (row, 256-column tile), z_y and RowGrad per row, and what the
// row-scaled backward needs.
int64_t TilePerTokenBytes(const HeadView& head) {
  const int64_t tiles = LogitsStatsTiles(head.padded_vocab);
  return head.padded_vocab * 2 + tiles * 5 * 4 + 4 + static_cast<int64_t>(sizeof(RowGrad)) +
         RowScaledPerTokenBytes(head);
}

int64_t TileScratchBytes(int64_t rows, const HeadView& head, const TokenBytes& tb) {
  const int64_t tiles = LogitsStatsTiles(head.padded_vocab);
  int64_t bytes = Carver::Round(rows * head.padded_vocab * 2) +
                  Carver::Round(rows * tiles * 4) * 5 + Carver::Round(rows * 4) +
                  Carver::Round(rows * static_cast<int64_t>(sizeof(RowGrad)));
  bytes +=
      Carver::Round(rows * tb.conv) + Carver::Round(rows * tb.gi32) + Carver::Round(rows * tb.ones);
  if (RowScaledCapable(head)) {
    bytes += Carver::Round(rows * 4) * 2 + Carver::Round(rows * head.hidden * 2) +
             Carver::Round(rows * head.hidden * 4) + Carver::Round(4);
  }
  return bytes + 4096;
}

struct RowScaledScratch {
  float* reference = nullptr;   // M_t
  float* scale = nullptr;       // K_t
  void* x_scaled = nullptr;     // K_t x_t, head dtype
  float* grad_input = nullptr;  // E W, fp32
  int32_t* fallback = nullptr;
};

struct TileScratch {
  void* exp_dlogits = nullptr;
  TileStats stats;
  float* target_logit = nullptr;
  RowGrad* grad = nullptr;
  Scratch rest;             // conv, gi32, ones
  RowScaledScratch scaled;  // bf16 heads only
};

TileScratch CarveTile(char* base, int64_t rows, const HeadView& head, const TokenBytes& tb) {
  const int64_t tiles = LogitsStatsTiles(head.padded_vocab);
  Carver c(base);
  TileScratch s;
  s.exp_dlogits = c.TakeBytes(rows * head.padded_vocab * 2);
  s.stats.max = c.Take<float>(rows * tiles);
  s.stats.sum_exp = c.Take<float>(rows * tiles);
  s.stats.sez = c.Take<float>(rows * tiles);
  s.stats.sum_z = c.Take<float>(rows * tiles);
  s.stats.argmax = c.Take<int32_t>(rows * tiles);
  s.target_logit = c.Take<float>(rows);
  s.grad = c.Take<RowGrad>(rows);
  if (tb.conv) s.rest.conv = c.TakeBytes(rows * tb.conv);
  if (tb.gi32) s.rest.gi32 = c.Take<float>(rows * head.hidden);
  s.rest.ones = c.TakeBytes(rows * tb.ones);
  if (RowScaledCapable(head)) {
    s.scaled.reference = c.Take<float>(rows);
    s.scaled.scale = c.Take<float>(rows);
    s.scaled.x_scaled = c.TakeBytes(rows * head.hidden * 2);
    s.scaled.grad_input = c.Take<float>(rows * head.hidden);
    s.scaled.fallback = c.Take<int32_t>(1);
  }
  return s;
}

// The chunked plan takes the logits-stats GEMM for plain logits (no bias,
// softcap or temperature) on heads and devices it supports.
bool UseTileStats(const HeadView& head, const PlanRequest& req) {
  return req.plain_logits && head.bias == nullptr && LogitsStatsSupported(head.dtype, head.hidden);
}

Gemm MakeGemm(const Exec& exec, const HeadView& head) {
  Gemm g;
  g.handle = exec.cublas;
  g.stream = exec.stream;
  g.health = exec.health;
  g.dtype = head.dtype;
  return g;
}

// X in the head's dtype: the request's rows or their conversion.
absl::StatusOr<const void*> HeadDtypeHidden(const Exec& exec, const HeadView& head,
                                            const DeviceRequest& r, const Scratch& s) {
  if (r.hidden_dtype == head.dtype) return r.hidden;
  FLCE_RETURN_IF_ERROR(LaunchConvert(r.hidden_dtype, r.hidden, head.dtype, s.conv,
                                     r.rows * head.hidden, exec.stream, exec.health));
  return static_cast<const void*>(s.conv);
}

DeviceRequest Slice(const DeviceRequest& r, int64_t begin, int64_t rows, int64_t hidden) {
  DeviceRequest out = r;
  out.rows = rows;
  const int64_t hs = DTypeSize(r.hidden_dtype);
  out.hidden = static_cast<const char*>(r.hidden) + begin * hidden * hs;
  if (r.grad_input) out.grad_input = static_cast<char*>(r.grad_input) + begin * hidden * hs;
  out.in.target = r.in.target + begin;
  out.in.token_weight = r.in.token_weight + begin;
  out.in.entropy_weight = r.in.entropy_weight + begin;
  auto shift = [begin](auto* p) { return p == nullptr ? p : p + begin; };
  out.out.loss = shift(r.out.loss);
  out.out.z_loss = shift(r.out.z_loss);
  out.out.logprob = shift(r.out.logprob);
  out.out.entropy = shift(r.out.entropy);
  out.out.argmax = shift(r.out.argmax);
  return out;
}

// grad_input from dlogits (row stride ld_d elements), grad_W and grad_b.
absl::Status Backward(const Exec& exec, const HeadView& head, const DeviceRequest& r,
                      const Scratch& s, const void* x, const void* dlogits, int64_t ld_d) {
  const Gemm gemm = MakeGemm(exec, head);
  if (r.grad_input != nullptr) {
    if (r.hidden_dtype == head.dtype) {
      FLCE_RETURN_IF_ERROR(gemm.GradInput(dlogits, ld_d, head.weight, r.rows, head.padded_vocab,
                                          head.hidden, r.grad_input, head.dtype, 0.0f));
    } else {
      FLCE_RETURN_IF_ERROR(gemm.GradInput(dlogits, ld_d, head.weight, r.rows, head.padded_vocab,
                                          head.hidden, s.gi32, DType::kF32, 0.0f));
      FLCE_RETURN_IF_ERROR(LaunchConvert(DType::kF32, s.gi32, r.hidden_dtype, r.grad_input,
                                         r.rows * head.hidden, exec.stream, exec.health));
    }
  }
  if (r.grad_weight != nullptr) {
    FLCE_RETURN_IF_ERROR(
        gemm.GradWeight(dlogits, ld_d, x, r.rows, head.padded_vocab, head.hidden, r.grad_weight));
  }
  if (r.grad_bias != nullptr) {
    FLCE_RETURN_IF_ERROR(LaunchFillOnes(head.dtype, s.ones, r.rows, exec.stream, exec.health));
    FLCE_RETURN_IF_ERROR(
        gemm.GradBias(dlogits, ld_d, s.ones, r.rows, head.padded_vocab, r.grad_bias));
  }
  return absl::OkStatus();
}

// FLCE_CUDA_ROW_KERNEL=cluster | two_pass picks the chunked plan's row
// kernel (benchmarks compare both; tests flip it). The default is the one
// measured faster on the H200 (docs/perf/cuda.md).
bool UseClusterRows() {
  const char* env = std::getenv("FLCE_CUDA_ROW_KERNEL");
  if (env == nullptr || *env == '\0') return kClusterRowsByDefault;
  return std::string(env) == "cluster";
}

bool UseOverlap() {
  const char* env = std::getenv("FLCE_CUDA_OVERLAP");
  return env != nullptr && std::string(env) == "1";
}

bool WantsBackward(const DeviceRequest& r) {
  return r.grad_input != nullptr || r.grad_weight != nullptr || r.grad_bias != nullptr;
}

absl::Status RunNaive(const Exec& exec, const HeadView& head, const DeviceRequest& r,
                      char* scratch) {
  const TokenBytes tb = PerTokenBytes(head, r.hidden_dtype, false);
  const Scratch s = Carve(scratch, r.rows, head.padded_vocab, tb, head, true, false);
  FLCE_ASSIGN_OR_RETURN(const void* x, HeadDtypeHidden(exec, head, r, s));
  FLCE_RETURN_IF_ERROR(MakeGemm(exec, head)
                           .Logits(x, head.weight, r.rows, head.padded_vocab, head.hidden, s.logits,
                                   head.padded_vocab));
  FusedRowArgs args;
  args.logits = s.logits;
  args.ld_logits = head.padded_vocab;
  args.padded_vocab = head.padded_vocab;
  args.rows = r.rows;
  args.bias = head.bias;
  args.dlogits = s.dlogits;
  args.dlogits_row_bytes = head.padded_vocab * DTypeSize(head.dtype);
  args.probs = static_cast<float*>(s.probs);
  args.in = r.in;
  args.out = r.out;
  args.params = r.params;
  FLCE_RETURN_IF_ERROR(LaunchFusedRows(head.dtype, args, exec.stream, exec.health));
  if (!WantsBackward(r)) return absl::OkStatus();
  return Backward(exec, head, r, s, x, s.dlogits, head.padded_vocab);
}

// The split kernels' view of one vocabulary split's logits in s.logits.
SplitArgs SplitArgsFor(const HeadView& head, const DeviceRequest& r, const Scratch& s, int64_t col0,
                       int64_t cols) {
  SplitArgs a;
  a.logits = s.logits;
  a.ld = cols;
  a.col0 = col0;
  a.cols = cols;
  a.rows = r.rows;
  a.bias = head.bias;
  a.target = r.in.target;
  a.params = r.params;
  return a;
}

// Forward over vocabulary splits: per-row state, then RowGrad and outputs.
absl::Status SplitForward(const Exec& exec, const HeadView& head, const Plan& plan,
                          const DeviceRequest& r, const Scratch& s, const void* x) {
  const Gemm gemm = MakeGemm(exec, head);
  const int64_t esize = DTypeSize(head.dtype);
  for (int64_t col0 = 0; col0 < head.padded_vocab; col0 += plan.split_cols) {
    const int64_t cols = std::min(plan.split_cols, head.padded_vocab - col0);
    FLCE_RETURN_IF_ERROR(
        gemm.Logits(x, static_cast<const char*>(head.weight) + col0 * head.hidden * esize, r.rows,
                    cols, head.hidden, s.logits, cols));
    const SplitArgs a = SplitArgsFor(head, r, s, col0, cols);
    FLCE_RETURN_IF_ERROR(
        LaunchSplitStats(head.dtype, a, s.state, col0 == 0, exec.stream, exec.health));
  }
  return LaunchFinishRows(s.state, r.rows, r.in, r.out, r.params, s.grad, exec.stream, exec.health);
}

absl::Status RunVocabSplitBlock(const Exec& exec, const HeadView& head, const Plan& plan,
                                const DeviceRequest& r, char* scratch) {
  const TokenBytes tb = PerTokenBytes(head, r.hidden_dtype, true);
  const Scratch s = Carve(scratch, r.rows, plan.split_cols, tb, head, false, true);
  FLCE_ASSIGN_OR_RETURN(const void* x, HeadDtypeHidden(exec, head, r, s));
  FLCE_RETURN_IF_ERROR(SplitForward(exec, head, plan, r, s, x));
  if (!WantsBackward(r)) return absl::OkStatus();
  const Gemm gemm = MakeGemm(exec, head);
  const int64_t esize = DTypeSize(head.dtype);
  if (r.grad_bias != nullptr) {
    FLCE_RETURN_IF_ERROR(LaunchFillOnes(head.dtype, s.ones, r.rows, exec.stream, exec.health));
  }
  for (int64_t col0 = 0; col0 < head.padded_vocab; col0 += plan.split_cols) {
    const int64_t cols = std::min(plan.split_cols, head.padded_vocab - col0);
    const void* w = static_cast<const char*>(head.weight) + col0 * head.hidden * esize;
    FLCE_RETURN_IF_ERROR(gemm.Logits(x, w, r.rows, cols, head.hidden, s.logits, cols));
    const SplitArgs a = SplitArgsFor(head, r, s, col0, cols);
    FLCE_RETURN_IF_ERROR(LaunchSplitGrad(head.dtype, a, s.grad, exec.stream, exec.health));
    // dlogits sit at the start of each fp32 row: row stride cols * 4 bytes.
    const int64_t ld_d = cols * 4 / esize;
    if (r.grad_input != nullptr) {
      FLCE_RETURN_IF_ERROR(gemm.GradInput(s.logits, ld_d, w, r.rows, cols, head.hidden, s.gi32,
                                          DType::kF32, col0 == 0 ? 0.0f : 1.0f));
    }
    if (r.grad_weight != nullptr) {
      FLCE_RETURN_IF_ERROR(gemm.GradWeight(s.logits, ld_d, x, r.rows, cols, head.hidden,
                                           r.grad_weight + col0 * head.hidden));
    }
    if (r.grad_bias != nullptr) {
      FLCE_RETURN_IF_ERROR(gemm.GradBias(s.logits, ld_d, s.ones, r.rows, cols, r.grad_bias + col0));
    }
  }
  if (r.grad_input != nullptr) {
    FLCE_RETURN_IF_ERROR(LaunchConvert(DType::kF32, s.gi32, r.hidden_dtype, r.grad_input,
                                       r.rows * head.hidden, exec.stream, exec.health));
  }
  return absl::OkStatus();
}

absl::Status RunFuseMNBlock(const Exec& exec, const HeadView& head, const Plan& plan,
                            const DeviceRequest& r, char* scratch) {
  const TokenBytes tb = PerTokenBytes(head, r.hidden_dtype, true);
  const Scratch s = Carve(scratch, r.rows, plan.split_cols, tb, head, false, true);
  FLCE_ASSIGN_OR_RETURN(const void* x, HeadDtypeHidden(exec, head, r, s));
  FLCE_RETURN_IF_ERROR(SplitForward(exec, head, plan, r, s, x));
  if (!WantsBackward(r)) return absl::OkStatus();
  if (r.grad_input != nullptr) {
    FLCE_CUDA_RETURN_IF_ERROR(
        cudaMemsetAsync(s.gi32, 0, r.rows * head.hidden * sizeof(float), exec.stream), exec.health);
  }
  FuseMNArgs a;
  a.x = x;
  a.w = head.weight;
  a.bias = head.bias;
  a.rows = r.rows;
  a.hidden = head.hidden;
  a.padded_vocab = head.padded_vocab;
  a.grad = s.grad;
  a.grad_input = r.grad_input != nullptr ? s.gi32 : nullptr;
  a.grad_weight = r.grad_weight;
  a.grad_bias = r.grad_bias;
  a.params = r.params;
  FLCE_RETURN_IF_ERROR(LaunchFuseMN(head.dtype, a, exec.stream, exec.health));
  if (r.grad_input != nullptr) {
    FLCE_RETURN_IF_ERROR(LaunchConvert(DType::kF32, s.gi32, r.hidden_dtype, r.grad_input,
                                       r.rows * head.hidden, exec.stream, exec.health));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Plan> MakePlan(const HeadView& head, const PlanRequest& req, int64_t budget) {
  Plan plan;
  plan.strategy = req.strategy == Strategy::kAuto ? Strategy::kChunked : req.strategy;
  const int64_t n = std::max<int64_t>(req.num_tokens, 1);
  const int64_t hs_in = DTypeSize(req.hidden_dtype);
  switch (plan.strategy) {
    case Strategy::kChunked: {
      const TokenBytes tb = PerTokenBytes(head, req.hidden_dtype, false);
      // Two upload/download slots: hidden in, grad_input out, row inputs and
      // outputs (target, a, e; loss, z-loss, logprob, entropy, argmax).
      const int64_t slot_tok = req.streaming ? 2 * (2 * head.hidden * hs_in + 12 + 20) : 0;
      plan.tile_stats = UseTileStats(head, req);
      const int64_t per_tok = (plan.tile_stats ? TilePerTokenBytes(head) : head.padded_vocab * 4) +
                              tb.total() + slot_tok;
      int64_t chunk = AlignDown((budget - 64 * 1024) / per_tok, ChunkPolicy::kTokenAlign);
      chunk = std::min(chunk, ChunkPolicy::kMaxTokens);
      // The floor applies to what the budget allows, not to a caller's
      // explicit (possibly tiny) chunk_tokens.
      if (chunk < std::min<int64_t>(ChunkPolicy::kMinTokens, n)) {
        return Exhausted("chunked plan", per_tok * ChunkPolicy::kMinTokens, budget,
                         "Raise --workspace-mb.");
      }
      if (req.chunk_tokens > 0) chunk = std::min(chunk, req.chunk_tokens);
      chunk = std::min(chunk, AlignUp(n, ChunkPolicy::kTokenAlign));
      plan.chunk_tokens = chunk;
      plan.scratch_bytes = plan.tile_stats ? TileScratchBytes(chunk, head, tb)
                                           : ScratchBytes(chunk, head.padded_vocab, tb, 0);
      if (req.streaming) {
        plan.stream_slot_bytes =
            Carver::Round(chunk * head.hidden * hs_in) * 2 + Carver::Round(chunk * 4) * 8 + 256;
      }
      return plan;
    }
    case Strategy::kSeparate: {
      const TokenBytes tb = PerTokenBytes(head, req.hidden_dtype, false);
      plan.chunk_tokens = n;
      plan.scratch_bytes = ScratchBytes(n, head.padded_vocab, tb, 0);
      if (plan.scratch_bytes > budget) {
        return Exhausted("separate plan (full tokens x V dlogits)", plan.scratch_bytes, budget,
                         "Use the chunked strategy or raise --workspace-mb.");
      }
      return plan;
    }
    case Strategy::kNaive: {
      const TokenBytes tb = PerTokenBytes(head, req.hidden_dtype, false);
      plan.chunk_tokens = n;
      // logits fp32 + softmax fp32 + dlogits in the head dtype.
      plan.scratch_bytes = Carver::Round(n * head.padded_vocab * 4) * 2 +
                           Carver::Round(n * head.padded_vocab * DTypeSize(head.dtype)) +
                           ScratchBytes(n, 0, tb, 0);
      if (plan.scratch_bytes > budget) {
        return Exhausted("naive plan (tokens x V logits, softmax and dlogits)", plan.scratch_bytes,
                         budget, "Use the chunked strategy or raise --workspace-mb.");
      }
      return plan;
    }
    case Strategy::kFuseMN:
      // fp32 atomics cannot give a fixed summation order: a deterministic
      // request runs vocab_split (the same stats pass, cuBLAS backward) and
      // reports it in strategy_used.
      if (req.deterministic) plan.strategy = Strategy::kVocabSplit;
      [[fallthrough]];
    case Strategy::kVocabSplit: {
      TokenBytes tb = PerTokenBytes(head, req.hidden_dtype, true);
      tb.rowstate = sizeof(RowState) + sizeof(RowGrad);
      int64_t rows = std::min(AlignUp(n, ChunkPolicy::kTokenAlign), VocabSplitPolicy::kMaxTokens);
      for (;;) {
        const int64_t fixed = ScratchBytes(rows, 0, tb, 0);
        int64_t cols =
            fixed < budget ? AlignDown((budget - fixed) / (rows * 4), VocabPolicy::kAlign) : 0;
        cols = std::min({cols, VocabSplitPolicy::kMaxSplit, head.padded_vocab});
        if (cols >= std::min(VocabSplitPolicy::kMinSplit, head.padded_vocab)) {
          plan.chunk_tokens = rows;
          plan.split_cols = cols;
          plan.scratch_bytes = ScratchBytes(rows, cols, tb, 0);
          return plan;
        }
        if (rows <= ChunkPolicy::kTokenAlign) {
          return Exhausted("vocab_split plan",
                           ScratchBytes(rows, VocabSplitPolicy::kMinSplit, tb, 0), budget,
                           "Raise --workspace-mb.");
        }
        rows = AlignUp(rows / 2, ChunkPolicy::kTokenAlign);
      }
    }
    case Strategy::kAuto:
      break;
  }
  return absl::InvalidArgumentError("unknown strategy");
}

// The chunked plan's row kernel: single-pass cluster when selected and the
// row fits a cluster, else the two-pass kernel.
absl::Status LaunchRows(const Exec& exec, const HeadView& head, const FusedRowArgs& args,
                        cudaStream_t stream) {
  absl::Status st = absl::FailedPreconditionError("cluster kernel not selected");
  if (UseClusterRows()) st = LaunchClusterRows(head.dtype, args, stream, exec.health);
  if (absl::IsFailedPrecondition(st)) st = LaunchFusedRows(head.dtype, args, stream, exec.health);
  return st;
}

// Two half-chunks: the row kernel of one half runs on the side stream beside
// the logits GEMM / grad_input GEMM of the other; grad_W and grad_b take the
// whole chunk at the end (one pass over the fp32 accumulator).
//   compute: L(A) ->e0 L(B) ->e1 [e2] GI(A) [e3] GI(B) GW GB
//   side:    [e0] R(A) ->e2 [e1] R(B) ->e3
absl::Status RunChunkOverlapped(const Exec& exec, const HeadView& head, const DeviceRequest& r,
                                const Scratch& s, const void* x, const FusedRowArgs& args,
                                int64_t ld_d) {
  const Gemm gemm = MakeGemm(exec, head);
  const int64_t half = AlignDown(r.rows / 2, ChunkPolicy::kTokenAlign);
  const int64_t rows[2] = {half, r.rows - half};
  const int64_t first[2] = {0, half};
  const int64_t xes = DTypeSize(head.dtype);
  for (int h = 0; h < 2; ++h) {
    FLCE_RETURN_IF_ERROR(gemm.Logits(static_cast<const char*>(x) + first[h] * head.hidden * xes,
                                     head.weight, rows[h], head.padded_vocab, head.hidden,
                                     s.logits + first[h] * head.padded_vocab, head.padded_vocab));
    FLCE_CUDA_RETURN_IF_ERROR(cudaEventRecord(exec.events[h], exec.stream), exec.health);
  }
  for (int h = 0; h < 2; ++h) {
    FLCE_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(exec.side, exec.events[h], 0), exec.health);
    FusedRowArgs a = args;
    a.rows = rows[h];
    a.logits = args.logits + first[h] * head.padded_vocab;
    a.dlogits = const_cast<float*>(a.logits);
    a.in.target += first[h];
    a.in.token_weight += first[h];
    a.in.entropy_weight += first[h];
    auto shift = [&](auto* p) { return p == nullptr ? p : p + first[h]; };
    a.out.loss = shift(a.out.loss);
    a.out.z_loss = shift(a.out.z_loss);
    a.out.logprob = shift(a.out.logprob);
    a.out.entropy = shift(a.out.entropy);
    a.out.argmax = shift(a.out.argmax);
    FLCE_RETURN_IF_ERROR(LaunchRows(exec, head, a, exec.side));
    FLCE_CUDA_RETURN_IF_ERROR(cudaEventRecord(exec.events[2 + h], exec.side), exec.health);
  }
  const bool direct = r.hidden_dtype == head.dtype;
  const int64_t hs = DTypeSize(r.hidden_dtype);
  for (int h = 0; h < 2; ++h) {
    FLCE_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(exec.stream, exec.events[2 + h], 0), exec.health);
    if (r.grad_input == nullptr) continue;
    const void* d = s.logits + first[h] * head.padded_vocab;
    void* out =
        direct ? static_cast<void*>(static_cast<char*>(r.grad_input) + first[h] * head.hidden * hs)
               : static_cast<void*>(s.gi32 + first[h] * head.hidden);
    FLCE_RETURN_IF_ERROR(gemm.GradInput(d, ld_d, head.weight, rows[h], head.padded_vocab,
                                        head.hidden, out, direct ? head.dtype : DType::kF32, 0.0f));
  }
  if (r.grad_input != nullptr && !direct) {
    FLCE_RETURN_IF_ERROR(LaunchConvert(DType::kF32, s.gi32, r.hidden_dtype, r.grad_input,
                                       r.rows * head.hidden, exec.stream, exec.health));
  }
  DeviceRequest rest = r;
  rest.grad_input = nullptr;  // done above
  return Backward(exec, head, rest, s, x, s.logits, ld_d);
}

// The row-scaled backward serves bf16 heads without label smoothing or
// entropy weights (their dlogits are not one scale per row away from e).
// FLCE_CUDA_DLOGITS_PASS=1 keeps the dlogits pass (tests compare both).
bool UseRowScaled(const HeadView& head, const DeviceRequest& r) {
  const char* env = std::getenv("FLCE_CUDA_DLOGITS_PASS");
  if (env != nullptr && std::string(env) == "1") return false;
  return RowScaledCapable(head) && WantsBackward(r) && r.grad_bias == nullptr &&
         r.params.label_smoothing == 0.0f && !r.params.entropy_weighted;
}

// The same chunk without the dlogits pass (row_scaled_backward.cuh): e
// relative to M_t = x_t . W_y, one scale per row applied around the two
// cuBLAS GEMMs. Rows it cannot serve raise a device flag; the launches after
// the finish then redo the chunk on the dlogits-pass path (each reads the
// flag and returns at once in the common case).
absl::Status RunRowScaledChunk(const Exec& exec, const HeadView& head, const TileScratch& s,
                               const DeviceRequest& r, const void* x, LogitsStatsArgs g,
                               TileRowArgs t) {
  const RowScaledScratch& q = s.scaled;
  FLCE_RETURN_IF_ERROR(LaunchRowReference(head.dtype, x, head.weight, r.in.target, r.rows,
                                          head.hidden, q.reference, q.fallback, exec.stream,
                                          exec.health));
  g.row_reference = q.reference;
  FLCE_RETURN_IF_ERROR(LaunchLogitsStats(head.dtype, g, exec.stream, exec.health));
  TileRowArgs scaled = t;
  scaled.row_reference = q.reference;
  scaled.row_scale = q.scale;
  scaled.fallback = q.fallback;
  FLCE_RETURN_IF_ERROR(LaunchTileFinish(scaled, exec.stream, exec.health));
  // The fallback: fp16 e per tile, the plain finish, the dlogits pass.
  g.row_reference = nullptr;
  g.run_if = q.fallback;
  t.run_if = q.fallback;
  FLCE_RETURN_IF_ERROR(LaunchLogitsStats(head.dtype, g, exec.stream, exec.health));
  FLCE_RETURN_IF_ERROR(LaunchTileFinish(t, exec.stream, exec.health));
  FLCE_RETURN_IF_ERROR(LaunchTileGrad(head.dtype, t, exec.stream, exec.health));
  // E is now either row-scaled e (with the target entries rewritten) or
  // dlogits; the scale kernels apply K_t or 1 accordingly.
  const Gemm gemm = MakeGemm(exec, head);
  if (r.grad_input != nullptr) {
    FLCE_RETURN_IF_ERROR(gemm.GradInput(s.exp_dlogits, head.padded_vocab, head.weight, r.rows,
                                        head.padded_vocab, head.hidden, q.grad_input, DType::kF32,
                                        0.0f));
    FLCE_RETURN_IF_ERROR(LaunchScaleRows(DType::kF32, q.grad_input, r.hidden_dtype, r.grad_input,
                                         r.rows, head.hidden, q.scale, q.fallback, exec.stream,
                                         exec.health));
  }
  if (r.grad_weight != nullptr) {
    FLCE_RETURN_IF_ERROR(LaunchScaleRows(head.dtype, x, head.dtype, q.x_scaled, r.rows, head.hidden,
                                         q.scale, q.fallback, exec.stream, exec.health));
    FLCE_RETURN_IF_ERROR(gemm.GradWeight(s.exp_dlogits, head.padded_vocab, q.x_scaled, r.rows,
                                         head.padded_vocab, head.hidden, r.grad_weight));
  }
  return absl::OkStatus();
}

// The logits-stats GEMM's and the row kernels' arguments for one chunk.
void TileChunkArgs(const HeadView& head, const DeviceRequest& r, const TileScratch& s,
                   const void* x, LogitsStatsArgs* g, TileRowArgs* t) {
  g->x = x;
  g->w = head.weight;
  g->rows = r.rows;
  g->hidden = head.hidden;
  g->vocab = head.vocab;
  g->padded_vocab = head.padded_vocab;
  g->exp_out = s.exp_dlogits;
  g->target = r.in.target;
  g->target_logit = s.target_logit;
  g->stats = s.stats;
  g->sum_z = r.params.label_smoothing > 0.0f;
  t->rows = r.rows;
  t->padded_vocab = head.padded_vocab;
  t->tiles = LogitsStatsTiles(head.padded_vocab);
  t->stats = s.stats;
  t->target_logit = s.target_logit;
  t->in = r.in;
  t->out = r.out;
  t->params = r.params;
  t->grad = s.grad;
  t->exp_dlogits = s.exp_dlogits;
}

// One chunk on the logits-stats path: GEMM + partials, row finish, dlogits
// in place of e, then the cuBLAS backward over the 16-bit dlogits.
absl::Status RunTileStatsChunk(const Exec& exec, const HeadView& head, const Plan& plan,
                               const DeviceRequest& r, char* scratch) {
  if (r.params.softcap > 0.0f || r.params.temperature != 1.0f || head.bias != nullptr) {
    return absl::InternalError("logits-stats plan given a logit transform");
  }
  const TokenBytes tb = PerTokenBytes(head, r.hidden_dtype, false);
  const TileScratch s = CarveTile(scratch, plan.chunk_tokens, head, tb);
  FLCE_ASSIGN_OR_RETURN(const void* x, HeadDtypeHidden(exec, head, r, s.rest));
  LogitsStatsArgs g;
  TileRowArgs t;
  TileChunkArgs(head, r, s, x, &g, &t);
  if (UseRowScaled(head, r)) return RunRowScaledChunk(exec, head, s, r, x, g, t);
  FLCE_RETURN_IF_ERROR(LaunchLogitsStats(head.dtype, g, exec.stream, exec.health));
  FLCE_RETURN_IF_ERROR(LaunchTileFinish(t, exec.stream, exec.health));
  if (!WantsBackward(r)) return absl::OkStatus();
  FLCE_RETURN_IF_ERROR(LaunchTileGrad(head.dtype, t, exec.stream, exec.health));
  return Backward(exec, head, r, s.rest, x, s.exp_dlogits, head.padded_vocab);
}

absl::StatusOr<TileChunkLaunch> PrepareTileChunk(const Exec& exec, const HeadView& head,
                                                 const Plan& plan, const DeviceRequest& r,
                                                 char* scratch) {
  if (!plan.tile_stats || r.rows > plan.chunk_tokens) {
    return absl::InternalError("not a chunk of a logits-stats plan");
  }
  const TokenBytes tb = PerTokenBytes(head, r.hidden_dtype, false);
  const TileScratch s = CarveTile(scratch, plan.chunk_tokens, head, tb);
  TileChunkLaunch launch;
  FLCE_ASSIGN_OR_RETURN(launch.x, HeadDtypeHidden(exec, head, r, s.rest));
  TileChunkArgs(head, r, s, launch.x, &launch.gemm, &launch.rows);
  launch.row_reference = s.scaled.reference;
  launch.fallback = s.scaled.fallback;
  return launch;
}

absl::Status RunChunk(const Exec& exec, const HeadView& head, const Plan& plan,
                      const DeviceRequest& r, char* scratch) {
  if (r.rows > plan.chunk_tokens) return absl::InternalError("chunk larger than the plan's");
  if (plan.tile_stats) return RunTileStatsChunk(exec, head, plan, r, scratch);
  const TokenBytes tb = PerTokenBytes(head, r.hidden_dtype, false);
  const Scratch s = Carve(scratch, plan.chunk_tokens, head.padded_vocab, tb, head, false, false);
  FLCE_ASSIGN_OR_RETURN(const void* x, HeadDtypeHidden(exec, head, r, s));
  const bool backward = WantsBackward(r);
  const bool overlap =
      backward && UseOverlap() && exec.side != nullptr && r.rows >= 2 * ChunkPolicy::kTokenAlign;
  if (!overlap) {
    FLCE_RETURN_IF_ERROR(MakeGemm(exec, head)
                             .Logits(x, head.weight, r.rows, head.padded_vocab, head.hidden,
                                     s.logits, head.padded_vocab));
  }
  FusedRowArgs args;
  args.logits = s.logits;
  args.ld_logits = head.padded_vocab;
  args.padded_vocab = head.padded_vocab;
  args.rows = r.rows;
  args.bias = head.bias;
  args.dlogits = backward ? s.logits : nullptr;  // in place
  args.dlogits_row_bytes = head.padded_vocab * 4;
  args.in = r.in;
  args.out = r.out;
  args.params = r.params;
  const int64_t ld_d = head.padded_vocab * 4 / DTypeSize(head.dtype);
  if (backward && UseOverlap() && exec.side != nullptr && r.rows >= 2 * ChunkPolicy::kTokenAlign) {
    return RunChunkOverlapped(exec, head, r, s, x, args, ld_d);
  }
  FLCE_RETURN_IF_ERROR(LaunchRows(exec, head, args, exec.stream));
  if (!backward) return absl::OkStatus();
  return Backward(exec, head, r, s, x, s.logits, ld_d);
}

absl::Status RunPlan(const Exec& exec, const HeadView& head, const Plan& plan,
                     const DeviceRequest& r, char* scratch) {
  switch (plan.strategy) {
    case Strategy::kChunked:
    case Strategy::kSeparate:
      for (int64_t b = 0; b < r.rows; b += plan.chunk_tokens) {
        FLCE_RETURN_IF_ERROR(
            RunChunk(exec, head, plan,
                     Slice(r, b, std::min(plan.chunk_tokens, r.rows - b), head.hidden), scratch));
      }
      return absl::OkStatus();
    case Strategy::kNaive:
      return RunNaive(exec, head, r, scratch);
    case Strategy::kVocabSplit:
    case Strategy::kFuseMN:
      for (int64_t b = 0; b < r.rows; b += plan.chunk_tokens) {
        DeviceRequest block = Slice(r, b, std::min(plan.chunk_tokens, r.rows - b), head.hidden);
        if (plan.strategy == Strategy::kVocabSplit) {
          FLCE_RETURN_IF_ERROR(RunVocabSplitBlock(exec, head, plan, block, scratch));
        } else {
          FLCE_RETURN_IF_ERROR(RunFuseMNBlock(exec, head, plan, block, scratch));
        }
      }
      return absl::OkStatus();
    case Strategy::kAuto:
      break;
  }
  return absl::InvalidArgumentError("plan without a strategy");
}

}  // namespace flce::cuda
