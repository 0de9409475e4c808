// MakePlan: which plan a request gets and how much device scratch it needs,
// from the strategy asked for and the workspace budget.
#include <algorithm>

#include "core/status_macros.h"
#include "kernels/cuda/base/device_memory.h"
#include "kernels/cuda/base/policy.h"
#include "kernels/cuda/plans/plan_parts.h"

namespace flce::cuda {

using namespace plan_parts;  // NOLINT(build/namespaces): the plans' shared parts

namespace {

// As many chunks as `chunk` needs for n tokens, of equal size (rounded up to
// kBalancedAlign, never above `chunk`).
int64_t BalancedChunk(int64_t chunk, int64_t n) {
  const int64_t chunks = (n + chunk - 1) / chunk;
  if (chunks < 2) return chunk;
  return std::min(chunk, AlignUp((n + chunks - 1) / chunks, ChunkPolicy::kBalancedAlign));
}

}  // namespace

absl::StatusOr<Plan> MakePlan(const HeadView& head, const PlanRequest& req, int64_t budget) {
  Plan plan;
  plan.switches = PlanSwitches(req);
  plan.strategy = req.strategy == Strategy::kAuto ? Strategy::kChunked : req.strategy;
  const int64_t n = std::max<int64_t>(req.num_tokens, 1);
  const int64_t hs_in = DTypeSize(req.hidden_dtype);
  switch (plan.strategy) {
    case Strategy::kChunked: {
      const TokenBytes tb = PerTokenBytes(head, req.hidden_dtype, false);
      // Upload/download slots: hidden in, grad_input out, row inputs and
      // outputs (target, a, e; loss, z-loss, logprob, entropy, argmax).
      const bool paced = req.wire_paced && req.chunk_tokens == 0;
      plan.stream_slots =
          !req.streaming ? 0 : paced ? WireSlots(plan.switches) : ChunkPolicy::kStreamSlots;
      const int64_t slot_tok = plan.stream_slots * (2 * head.hidden * hs_in + 12 + 20);
      plan.tile_stats = UseTileStats(head, req, plan.switches);
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
      chunk = BalancedChunk(chunk, n);
      if (req.chunk_tokens > 0) chunk = std::min(chunk, req.chunk_tokens);
      chunk = std::min(chunk, AlignUp(n, ChunkPolicy::kTokenAlign));
      plan.chunk_tokens = chunk;
      if (paced) {
        const int64_t by_bytes = AlignDown(ChunkPolicy::kWirePacedBytes / (head.hidden * hs_in),
                                           ChunkPolicy::kTokenAlign);
        const int64_t edge = std::clamp(by_bytes, ChunkPolicy::kWirePacedMinTokens,
                                        ChunkPolicy::kWirePacedMaxTokens);
        if (edge < chunk) plan.edge_tokens = edge;
      }
      plan.scratch_bytes = plan.tile_stats ? TileScratchBytes(chunk, head, tb)
                                           : ScratchBytes(chunk, head.padded_vocab, tb, 0);
      if (req.streaming) {
        plan.stream_slot_bytes =
            Carver::Round(chunk * head.hidden * hs_in) * 2 + Carver::Round(kRowInputs * chunk * 4) +
            Carver::Round(kRowOutputs * chunk * 4);
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
      const int64_t rows =
          std::min(AlignUp(n, ChunkPolicy::kTokenAlign), VocabSplitPolicy::kMaxTokens);
      auto bytes = [&](int64_t r, int64_t cols) { return ScratchBytes(r, cols, tb, 0); };
      const SplitFit fit = FitVocabSplit(rows, head.padded_vocab, budget, bytes);
      if (!fit.fits) {
        return Exhausted("vocab_split plan", bytes(fit.rows, VocabSplitPolicy::kMinSplit), budget,
                         "Raise --workspace-mb.");
      }
      plan.chunk_tokens = fit.rows;
      plan.split_cols = fit.cols;
      plan.scratch_bytes = bytes(fit.rows, fit.cols);
      return plan;
    }
    case Strategy::kAuto:
      break;
  }
  return absl::InvalidArgumentError("unknown strategy");
}

}  // namespace flce::cuda
