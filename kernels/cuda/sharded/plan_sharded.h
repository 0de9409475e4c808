// The plan of a head split by vocabulary across GPUs (Megatron's and verl's
// vocab-parallel cross-entropy). Per block of tokens:
//   1. every shard: its columns' logits and their online-softmax states
//      (the vocab_split kernels, with whole-vocabulary column numbers);
//   2. the states all-gathered and merged in shard order on every shard, so
//      that every shard finishes the rows with the same LSE;
//   3. every shard: dlogits over its columns, its part of grad_input (fp32)
//      and its rows' grad_W / grad_b;
//   4. the grad_input parts summed onto the first shard, which writes the
//      block's grad_input and per-token outputs.
// chunked keeps each shard's logits of the block: on Hopper with plain logits
// through the logits-stats GEMM (each shard's tiles reduced to one state per
// row before the all-gather, then the dlogits pass over its 2-byte e),
// else as fp32 in one split; vocab_split recomputes them split by split in the
// backward.
#ifndef FLCE_KERNELS_CUDA_SHARDED_PLAN_SHARDED_H_
#define FLCE_KERNELS_CUDA_SHARDED_PLAN_SHARDED_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/cuda/plans/plans.h"
#include "kernels/cuda/sharded/shard_collective.h"

namespace flce::cuda {

struct ShardPlan {
  Strategy strategy = Strategy::kChunked;  // kChunked, kSeparate or kVocabSplit
  int64_t chunk_tokens = 0;                // tokens per block
  int64_t split_cols = 0;                  // columns per split (chunked: a shard's all)
  int64_t scratch_bytes = 0;               // workspace on every shard
  bool tile_stats = false;                 // chunked: the logits-stats GEMM per shard
  KernelSwitches switches;                 // FLCE_CUDA_* as read when the plan was made
};

// One shard's part of a block.
struct ShardTask {
  int device = 0;
  Exec exec;  // its switches: the plan's
  HeadView head;              // the shard's rows (padded_vocab 0 for an empty shard)
  int64_t first_column = 0;   // the shard's first row in the whole vocabulary
  int64_t columns = 0;        // its real rows
  DeviceRequest request;      // the block on this shard's GPU; grad_input on the first only
  char* scratch = nullptr;    // plan.scratch_bytes
};

// kAuto: chunked where a block of at least ChunkPolicy::kMaxTokens / 8 tokens
// fits, else vocab_split. fuse_mn runs vocab_split (its atomics have no
// sharded form); naive is refused (it exists to show one GPU's memory wall).
absl::StatusOr<ShardPlan> MakeShardPlan(const std::vector<HeadView>& shards,
                                        const PlanRequest& request, int64_t budget_bytes);

absl::Status RunShardedBlock(const ShardPlan& plan, const std::vector<ShardTask>& tasks,
                             ShardCollective& collective);

// What a block runs on a shard with columns (`t`), in DescribeChunkKernels's
// words: logits= (stats_cooperative, cublas_fp32_splits), rows= (the shards'
// states merged: tile_reduce+shard_merge+dlogits_pass,
// online_softmax+shard_merge) and where asked grad_input= and grad_weight=.
std::string DescribeShardKernels(const ShardPlan& plan, const ShardTask& t);

}  // namespace flce::cuda

#endif  // FLCE_KERNELS_CUDA_SHARDED_PLAN_SHARDED_H_
