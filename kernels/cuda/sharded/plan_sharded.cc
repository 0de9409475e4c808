#include "kernels/cuda/sharded/plan_sharded.h"

#include <algorithm>

#include "core/status_macros.h"
#include "kernels/cuda/base/device_memory.h"
#include "kernels/cuda/base/policy.h"
#include "kernels/cuda/ops/elementwise_kernels.cuh"
#include "kernels/cuda/ops/split_row_kernels.cuh"
#include "kernels/cuda/ops/tile_stats_kernels.cuh"
#include "kernels/cuda/plans/kernel_report.h"
#include "kernels/cuda/plans/plan_parts.h"

namespace flce::cuda {
namespace {

using plan_parts::AlignDown;
using plan_parts::AlignUp;

// What both flavours of a shard's scratch start with: every shard's states
// of the block's rows (the all-gather's destination) and the grad_input part
// received from another shard.
int64_t ExchangeBytes(int64_t rows, const HeadView& head, int shards) {
  return Carver::Round(rows * shards * static_cast<int64_t>(sizeof(RowState))) +
         Carver::Round(rows * head.hidden * 4);
}

// The fp32 flavour then carves what a vocab_split block does (logits of one
// split, hidden conversion, the fp32 grad_input part, the bias GEMM's ones,
// the rows' state and RowGrad).
plan_parts::TokenBytes SplitTokenBytes(const HeadView& head, DType hidden_dtype) {
  plan_parts::TokenBytes tb = plan_parts::PerTokenBytes(head, hidden_dtype, true);
  tb.rowstate = sizeof(RowState) + sizeof(RowGrad);
  return tb;
}

int64_t ShardScratchBytes(int64_t rows, int64_t cols, const HeadView& head, DType hidden_dtype,
                          int shards) {
  return ExchangeBytes(rows, head, shards) +
         plan_parts::ScratchBytes(rows, cols, SplitTokenBytes(head, hidden_dtype), 0) + 512;
}

// The logits-stats flavour: the rows' merged state and the shard-local
// targets, then a logits-stats chunk's scratch.
int64_t TileShardBytes(int64_t rows, const HeadView& head, DType hidden_dtype, int shards) {
  return ExchangeBytes(rows, head, shards) +
         Carver::Round(rows * static_cast<int64_t>(sizeof(RowState))) + Carver::Round(rows * 4) +
         plan_parts::TileScratchBytes(rows, head,
                                      plan_parts::PerTokenBytes(head, hidden_dtype, true)) +
         512;
}

struct ShardScratch {
  plan_parts::Scratch s;   // logits, conv, gi32, ones, state, grad
  RowState* gathered = nullptr;
  float* received = nullptr;
  // The logits-stats flavour (s.grad, s.gi32 and s.conv then point into it).
  plan_parts::TileScratch tile;
  int32_t* local_target = nullptr;
};

// Carves ExchangeBytes' two regions.
ShardScratch CarveExchange(Carver& c, int64_t rows, const HeadView& head, int shards) {
  ShardScratch out;
  out.gathered = c.Take<RowState>(rows * shards);
  out.received = c.Take<float>(rows * head.hidden);
  return out;
}

ShardScratch CarveTileShard(char* base, int64_t rows, const HeadView& head, DType hidden_dtype,
                            int shards) {
  Carver c(base);
  ShardScratch out = CarveExchange(c, rows, head, shards);
  out.s.state = c.Take<RowState>(rows);
  out.local_target = c.Take<int32_t>(rows);
  out.tile = plan_parts::CarveTile(base + c.used(), rows, head,
                                   plan_parts::PerTokenBytes(head, hidden_dtype, true));
  out.s.grad = out.tile.grad;
  out.s.gi32 = out.tile.rest.gi32;
  out.s.conv = out.tile.rest.conv;
  return out;
}

// The logits-stats chunk's arguments for a shard: the whole head's, with
// shard-local targets for the GEMM's z_y and the tile reduce, and
// whole-vocabulary columns for argmax and the onehot.
void ShardTileArgs(const ShardTask& t, const ShardScratch& sc, const void* x, LogitsStatsArgs* g,
                   TileRowArgs* a) {
  plan_parts::TileChunkArgs(t.head, t.request, sc.tile, x, SwitchesOf(t.exec), g, a);
  g->target = sc.local_target;
  a->in.target = sc.local_target;
  a->vocab_end = t.columns;
  a->first_column = t.first_column;
}

ShardScratch CarveShard(char* base, int64_t rows, int64_t cols, const HeadView& head,
                        DType hidden_dtype, int shards) {
  Carver c(base);
  ShardScratch out = CarveExchange(c, rows, head, shards);
  out.s = plan_parts::Carve(base + c.used(), rows, cols, SplitTokenBytes(head, hidden_dtype), head,
                           false, true);
  return out;
}

SplitArgs ShardSplitArgs(const ShardTask& t, const ShardScratch& sc, int64_t col0, int64_t cols) {
  SplitArgs a = plan_parts::SplitArgsFor(t.head, t.request, sc.s, t.first_column + col0, cols);
  a.vocab_end = t.first_column + t.columns;
  a.bias_col0 = t.first_column;
  return a;
}

}  // namespace

absl::StatusOr<ShardPlan> MakeShardPlan(const std::vector<HeadView>& shards,
                                        const PlanRequest& req, int64_t budget) {
  const int count = static_cast<int>(shards.size());
  const HeadView* widest = &shards[0];
  for (const HeadView& h : shards) {
    if (h.padded_vocab > widest->padded_vocab) widest = &h;
  }
  const int64_t n = std::max<int64_t>(req.num_tokens, 1);
  ShardPlan plan;
  plan.switches = plan_parts::PlanSwitches(req);
  // The logits-stats GEMM where every shard with columns can take it.
  plan.tile_stats = req.strategy != Strategy::kVocabSplit && req.strategy != Strategy::kFuseMN;
  for (const HeadView& h : shards) {
    if (h.padded_vocab > 0) {
      plan.tile_stats = plan.tile_stats && plan_parts::UseTileStats(h, req, plan.switches);
    }
  }
  auto bytes = [&](int64_t rows, int64_t cols) {
    return plan.tile_stats ? TileShardBytes(rows, *widest, req.hidden_dtype, count)
                           : ShardScratchBytes(rows, cols, *widest, req.hidden_dtype, count);
  };
  switch (req.strategy) {
    case Strategy::kNaive:
      return absl::InvalidArgumentError(
          "strategy naive runs on one GPU only (it materialises every logit to show that "
          "memory wall); a head split across GPUs runs chunked, separate or vocab_split");
    case Strategy::kSeparate:
      plan.strategy = Strategy::kSeparate;
      plan.chunk_tokens = n;
      plan.split_cols = widest->padded_vocab;
      plan.scratch_bytes = bytes(n, plan.split_cols);
      if (plan.scratch_bytes > budget) {
        return plan_parts::Exhausted("separate plan (every token's logits of a shard)",
                                     plan.scratch_bytes, budget,
                                     "Use the chunked strategy or raise --workspace-mb.");
      }
      return plan;
    case Strategy::kChunked:
    case Strategy::kAuto: {
      const int64_t per_tok = bytes(1, widest->padded_vocab);
      int64_t chunk = std::min({AlignDown(budget / std::max<int64_t>(per_tok, 1),
                                          ChunkPolicy::kTokenAlign),
                                ChunkPolicy::kMaxTokens, n});
      while (chunk > 0 && bytes(chunk, widest->padded_vocab) > budget) --chunk;
      // The floor applies to what the budget allows, not to a caller's
      // explicit (possibly tiny) chunk_tokens.
      const int64_t floor = req.strategy == Strategy::kAuto
                                ? std::min(ChunkPolicy::kMaxTokens / 8, n)
                                : std::min(ChunkPolicy::kMinTokens, n);
      if (chunk >= floor && chunk > 0) {
        if (req.chunk_tokens > 0) chunk = std::min(chunk, req.chunk_tokens);
        plan.strategy = Strategy::kChunked;
        plan.chunk_tokens = chunk;
        plan.split_cols = widest->padded_vocab;
        plan.scratch_bytes = bytes(chunk, plan.split_cols);
        return plan;
      }
      if (req.strategy == Strategy::kChunked) {
        return plan_parts::Exhausted("chunked plan (a block's logits of a shard)",
                                     bytes(floor, widest->padded_vocab), budget,
                                     "Use vocab_split or raise --workspace-mb.");
      }
      [[fallthrough]];
    }
    case Strategy::kVocabSplit:
    case Strategy::kFuseMN: {
      plan.strategy = Strategy::kVocabSplit;
      plan.tile_stats = false;  // auto falling through: vocab_split recomputes fp32 splits
      int64_t rows = std::min(AlignUp(n, ChunkPolicy::kTokenAlign), VocabSplitPolicy::kMaxTokens);
      if (req.chunk_tokens > 0) rows = std::min(rows, req.chunk_tokens);
      const plan_parts::SplitFit fit =
          plan_parts::FitVocabSplit(rows, widest->padded_vocab, budget, bytes);
      if (!fit.fits) {
        return plan_parts::Exhausted("vocab_split plan",
                                     bytes(fit.rows, VocabSplitPolicy::kMinSplit), budget,
                                     "Raise --workspace-mb.");
      }
      plan.chunk_tokens = fit.rows;
      plan.split_cols = fit.cols;
      plan.scratch_bytes = bytes(fit.rows, fit.cols);
      return plan;
    }
  }
  return absl::InvalidArgumentError("unknown strategy");
}

absl::Status RunShardedBlock(const ShardPlan& plan, const std::vector<ShardTask>& tasks,
                             ShardCollective& collective) {
  const int count = static_cast<int>(tasks.size());
  const int64_t rows = tasks[0].request.rows;
  std::vector<ShardScratch> scratch(count);
  std::vector<const void*> x(count, nullptr);
  std::vector<const void*> states(count);
  std::vector<void*> gathered(count);

  // 1. Each shard's states over its columns.
  for (int s = 0; s < count; ++s) {
    const ShardTask& t = tasks[s];
    const Exec& e = t.exec;
    FLCE_CUDA_RETURN_IF_ERROR(cudaSetDevice(t.device), e.health);
    scratch[s] = plan.tile_stats
                     ? CarveTileShard(t.scratch, rows, t.head, t.request.hidden_dtype, count)
                     : CarveShard(t.scratch, rows, plan.split_cols, t.head, t.request.hidden_dtype,
                                  count);
    const ShardScratch& sc = scratch[s];
    states[s] = sc.s.state;
    gathered[s] = sc.gathered;
    if (t.head.padded_vocab == 0) {
      // An empty shard contributes empty states (no column seen).
      SplitArgs none = plan_parts::SplitArgsFor(t.head, t.request, sc.s, 0, 0);
      none.vocab_end = 0;
      FLCE_RETURN_IF_ERROR(
          LaunchSplitStats(t.head.dtype, none, sc.s.state, true, e.stream, e.health));
      continue;
    }
    FLCE_ASSIGN_OR_RETURN(x[s], plan_parts::HeadDtypeHidden(e, t.head, t.request, sc.s));
    if (plan.tile_stats) {
      FLCE_RETURN_IF_ERROR(LaunchLocalTargets(t.request.in.target, rows, t.first_column,
                                              t.columns, sc.local_target, e.stream, e.health));
      LogitsStatsArgs g;
      TileRowArgs a;
      ShardTileArgs(t, sc, x[s], &g, &a);
      FLCE_RETURN_IF_ERROR(LaunchLogitsStats(t.head.dtype, g, e.stream, e.health));
      FLCE_RETURN_IF_ERROR(LaunchTileReduce(a, sc.s.state, e.stream, e.health));
      continue;
    }
    const Gemm gemm = plan_parts::MakeGemm(e, t.head);
    const int64_t esize = DTypeSize(t.head.dtype);
    for (int64_t col0 = 0; col0 < t.head.padded_vocab; col0 += plan.split_cols) {
      const int64_t cols = std::min(plan.split_cols, t.head.padded_vocab - col0);
      FLCE_RETURN_IF_ERROR(gemm.Logits(
          x[s], static_cast<const char*>(t.head.weight) + col0 * t.head.hidden * esize, rows, cols,
          t.head.hidden, sc.s.logits, cols));
      FLCE_RETURN_IF_ERROR(LaunchSplitStats(t.head.dtype, ShardSplitArgs(t, sc, col0, cols),
                                            sc.s.state, col0 == 0, e.stream, e.health));
    }
  }

  // 2. Every shard merges every shard's states and finishes the rows.
  FLCE_RETURN_IF_ERROR(collective.AllGather(states, gathered, rows * sizeof(RowState)));
  for (int s = 0; s < count; ++s) {
    const ShardTask& t = tasks[s];
    const ShardScratch& sc = scratch[s];
    FLCE_CUDA_RETURN_IF_ERROR(cudaSetDevice(t.device), t.exec.health);
    FLCE_RETURN_IF_ERROR(
        LaunchMergeStates(sc.gathered, count, rows, sc.s.state, t.exec.stream, t.exec.health));
    FLCE_RETURN_IF_ERROR(LaunchFinishRows(sc.s.state, rows, t.request.in, t.request.out,
                                          t.request.params, sc.s.grad, t.exec.stream,
                                          t.exec.health));
  }
  // The first shard is never empty: it says whether there is a backward.
  if (!plan_parts::WantsBackward(tasks[0].request)) return absl::OkStatus();

  // 3. Each shard's backward over its columns.
  const bool want_gi = tasks[0].request.grad_input != nullptr;
  std::vector<float*> parts(count);
  for (int s = 0; s < count; ++s) {
    const ShardTask& t = tasks[s];
    const Exec& e = t.exec;
    const ShardScratch& sc = scratch[s];
    parts[s] = sc.s.gi32;
    FLCE_CUDA_RETURN_IF_ERROR(cudaSetDevice(t.device), e.health);
    if (t.head.padded_vocab == 0) {
      if (want_gi) {
        FLCE_CUDA_RETURN_IF_ERROR(
            cudaMemsetAsync(sc.s.gi32, 0, rows * t.head.hidden * 4, e.stream), e.health);
      }
      continue;
    }
    const Gemm gemm = plan_parts::MakeGemm(e, t.head);
    if (plan.tile_stats) {
      // dlogits over the 2-byte e in place, then the cuBLAS backward (no
      // bias on this path).
      LogitsStatsArgs g;
      TileRowArgs a;
      ShardTileArgs(t, sc, x[s], &g, &a);
      FLCE_RETURN_IF_ERROR(LaunchTileFactors(a, e.stream, e.health));
      FLCE_RETURN_IF_ERROR(LaunchTileGrad(t.head.dtype, a, e.stream, e.health));
      const int64_t padded = t.head.padded_vocab;
      if (want_gi) {
        FLCE_RETURN_IF_ERROR(gemm.GradInput(sc.tile.exp_dlogits, padded, t.head.weight, rows,
                                            padded, t.head.hidden, sc.s.gi32, DType::kF32, 0.0f));
      }
      if (t.request.grad_weight != nullptr) {
        FLCE_RETURN_IF_ERROR(gemm.GradWeight(sc.tile.exp_dlogits, padded, x[s], rows, padded,
                                             t.head.hidden, t.request.grad_weight));
      }
      continue;
    }
    const int64_t esize = DTypeSize(t.head.dtype);
    if (t.request.grad_bias != nullptr) {
      FLCE_RETURN_IF_ERROR(LaunchFillOnes(t.head.dtype, sc.s.ones, rows, e.stream, e.health));
    }
    const bool one_split = plan.split_cols >= t.head.padded_vocab;
    for (int64_t col0 = 0; col0 < t.head.padded_vocab; col0 += plan.split_cols) {
      const int64_t cols = std::min(plan.split_cols, t.head.padded_vocab - col0);
      const void* w = static_cast<const char*>(t.head.weight) + col0 * t.head.hidden * esize;
      // One split: its logits are still in the scratch from step 1.
      if (!one_split) {
        FLCE_RETURN_IF_ERROR(gemm.Logits(x[s], w, rows, cols, t.head.hidden, sc.s.logits, cols));
      }
      FLCE_RETURN_IF_ERROR(LaunchSplitGrad(t.head.dtype, ShardSplitArgs(t, sc, col0, cols),
                                           sc.s.grad, e.stream, e.health));
      const int64_t ld_d = cols * 4 / esize;
      if (want_gi) {
        FLCE_RETURN_IF_ERROR(gemm.GradInput(sc.s.logits, ld_d, w, rows, cols, t.head.hidden,
                                            sc.s.gi32, DType::kF32, col0 == 0 ? 0.0f : 1.0f));
      }
      if (t.request.grad_weight != nullptr) {
        FLCE_RETURN_IF_ERROR(gemm.GradWeight(sc.s.logits, ld_d, x[s], rows, cols, t.head.hidden,
                                             t.request.grad_weight + col0 * t.head.hidden));
      }
      if (t.request.grad_bias != nullptr) {
        FLCE_RETURN_IF_ERROR(gemm.GradBias(sc.s.logits, ld_d, sc.s.ones, rows, cols,
                                           t.request.grad_bias + col0));
      }
    }
  }
  if (!want_gi) return absl::OkStatus();

  // 4. grad_input on the first shard.
  FLCE_RETURN_IF_ERROR(collective.SumToFirst(parts, rows * tasks[0].head.hidden, scratch[0].received));
  const ShardTask& first = tasks[0];
  FLCE_CUDA_RETURN_IF_ERROR(cudaSetDevice(first.device), first.exec.health);
  return LaunchConvert(DType::kF32, parts[0], first.request.hidden_dtype, first.request.grad_input,
                       rows * first.head.hidden, first.exec.stream, first.exec.health);
}

std::string DescribeShardKernels(const ShardPlan& plan, const ShardTask& t) {
  return KernelWords(plan.tile_stats ? "stats_cooperative" : "cublas_fp32_splits",
                     plan.tile_stats ? "tile_reduce+shard_merge+dlogits_pass"
                                     : "online_softmax+shard_merge",
                     t.request, "cublas", CublasGradWeightWords(t.exec, t.head, t.request.rows));
}

}  // namespace flce::cuda
