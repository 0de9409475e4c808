#include "kernels/cuda/plans/plan_parts.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "kernels/cuda/base/device_memory.h"
#include "kernels/cuda/base/policy.h"
#include "kernels/cuda/ops/elementwise_kernels.cuh"
#include "kernels/cuda/ops/gemm_algos.h"
#include "kernels/cuda/ops/sm90/logits_stats_gemm.cuh"

namespace flce::cuda::plan_parts {
namespace {

// The row-scaled backward's scratch per token: M_t and K_t, the scaled hidden
// row (head dtype) and the unscaled fp32 grad_input row.
int64_t RowScaledPerTokenBytes(const HeadView& head) {
  return RowScaledCapable(head) ? 4 + 4 + head.hidden * 2 + head.hidden * 4 : 0;
}

}  // namespace

TokenBytes PerTokenBytes(const HeadView& head, DType hidden_dtype, bool accumulate_gi) {
  TokenBytes b;
  const bool convert = hidden_dtype != head.dtype;
  b.conv = convert ? head.hidden * DTypeSize(head.dtype) : 0;
  b.gi32 = (convert || accumulate_gi) ? head.hidden * 4 : 0;
  b.ones = DTypeSize(head.dtype);
  return b;
}

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

SplitFit FitVocabSplit(int64_t rows, int64_t vocab, int64_t budget,
                       const std::function<int64_t(int64_t rows, int64_t cols)>& bytes) {
  for (;;) {
    const int64_t fixed = bytes(rows, 0);
    int64_t cols =
        fixed < budget ? AlignDown((budget - fixed) / (rows * 4), VocabPolicy::kAlign) : 0;
    cols = std::min({cols, VocabSplitPolicy::kMaxSplit, vocab});
    if (cols >= std::min(VocabSplitPolicy::kMinSplit, vocab) && cols > 0) {
      return SplitFit{true, rows, cols};
    }
    if (rows <= ChunkPolicy::kTokenAlign) return SplitFit{false, rows, 0};
    rows = AlignUp(rows / 2, ChunkPolicy::kTokenAlign);
  }
}

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

bool RowScaledCapable(const HeadView& head) { return head.dtype == DType::kBF16; }

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
             Carver::Round(rows * head.hidden * 4) + Carver::Round(4) * 2;
  }
  return bytes + 4096;
}

int64_t TilePartialsBytes(int64_t rows, const HeadView& head) {
  // max, sum_exp, sez, sum_z and argmax, one region after another.
  const int64_t region = rows * LogitsStatsTiles(head.padded_vocab) * 4;
  return 4 * Carver::Round(region) + region;
}

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
  s.partials = s.stats.max;
  s.partials_bytes = TilePartialsBytes(rows, head);
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
    s.scaled.tile_counter = c.Take<int32_t>(1);
  }
  return s;
}

KernelSwitches PlanSwitches(const PlanRequest& req) {
  KernelSwitches s = KernelSwitchesFromEnvironment();
  if (req.deterministic && MeasuredGemmTiles(s.gemm_tiles.c_str())) s.gemm_tiles.clear();
  return s;
}

bool UseTileStats(const HeadView& head, const PlanRequest& req, const KernelSwitches& switches) {
  return req.plain_logits && head.bias == nullptr &&
         LogitsStatsChosen(switches, head.dtype, head.hidden);
}

Gemm MakeGemm(const Exec& exec, const HeadView& head) {
  Gemm g;
  g.handle = exec.cublas;
  g.algos = exec.gemm_algos;
  g.stream = exec.stream;
  g.health = exec.health;
  g.dtype = head.dtype;
  g.switches = exec.switches;
  return g;
}

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
  out.in = ShiftRows(r.in, begin);
  out.out = ShiftRows(r.out, begin);
  return out;
}

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

bool WantsBackward(const DeviceRequest& r) {
  return r.grad_input != nullptr || r.grad_weight != nullptr || r.grad_bias != nullptr;
}

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
  a.vocab_end = r.params.vocab;
  return a;
}

void TileChunkArgs(const HeadView& head, const DeviceRequest& r, const TileScratch& s,
                   const void* x, const KernelSwitches& switches, LogitsStatsArgs* g,
                   TileRowArgs* t) {
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
  g->argmax = r.out.argmax != nullptr;
  g->entropy = r.out.entropy != nullptr;
  g->pingpong_cols = StatsPingPongCols(switches, r.rows);
  g->pingpong_pairs = g->pingpong_cols == 192 && StatsPingPongPairs(switches, r.rows);
  g->token_tiles_per_group = StatsTokenTilesPerGroup(
      switches, static_cast<int32_t>((r.rows + kOwnTileRows - 1) / kOwnTileRows));
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
  t->vocab_end = r.params.vocab;
}

namespace {

// The forward over vocabulary splits: per-row state, then RowGrad and outputs.
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

}  // namespace

absl::StatusOr<SplitBlock> ForwardSplitBlock(const Exec& exec, const HeadView& head,
                                             const Plan& plan, const DeviceRequest& r,
                                             char* scratch) {
  const TokenBytes tb = PerTokenBytes(head, r.hidden_dtype, true);
  SplitBlock block;
  block.s = Carve(scratch, r.rows, plan.split_cols, tb, head, false, true);
  FLCE_ASSIGN_OR_RETURN(block.x, HeadDtypeHidden(exec, head, r, block.s));
  FLCE_RETURN_IF_ERROR(SplitForward(exec, head, plan, r, block.s, block.x));
  return block;
}

}  // namespace flce::cuda::plan_parts
