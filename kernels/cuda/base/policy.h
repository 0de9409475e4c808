// Tile shapes and chunk policies of the CUDA engine, in one place. Kernels and
// planners read these constants; which kernel takes which shape is
// kernel_choices.h's.
#ifndef FLCE_KERNELS_CUDA_BASE_POLICY_H_
#define FLCE_KERNELS_CUDA_BASE_POLICY_H_

#include <cstdint>

namespace flce::cuda {

struct VocabPolicy {
  // V is padded to this inside the engine: cuBLAS GEMMs whose leading
  // dimension is an odd V run several times slower (docs/perf/cuda.md).
  static constexpr int64_t kAlign = 128;
};
static_assert(VocabPolicy::kAlign % 8 == 0, "vector loads need 8-element alignment");

struct ChunkPolicy {
  // Token chunks are multiples of this (tensor-core friendly GEMM shapes).
  static constexpr int64_t kTokenAlign = 64;
  // Above ~8192 tokens a chunk gains nothing (the grad_W GEMM's fp32 C read
  // and write is already amortised) and only delays the first grad_input.
  static constexpr int64_t kMaxTokens = 8192;
  // Smallest chunk the planner accepts before refusing with RESOURCE_EXHAUSTED.
  static constexpr int64_t kMinTokens = 16;
  // A request of several budget-sized chunks gets as many chunks of equal
  // size, rounded up to this, instead of full chunks and a short remainder
  // (whose GEMMs fill the GPU's last wave poorly; docs/perf/cuda.md).
  static constexpr int64_t kBalancedAlign = 256;
  // A call whose hidden arrives over the wire at the wire's pace: the GPU
  // cannot start a chunk before all its rows are in, and the last chunk's
  // grad_input leaves only after the engine is done, so its first and last
  // chunks carry this much hidden (at most kWirePacedMaxTokens, at least
  // kWirePacedMinTokens) and the chunks between them grow to the budget's
  // (chunk_schedule.h; docs/perf/python.md).
  static constexpr int64_t kWirePacedBytes = int64_t{8} << 20;
  static constexpr int64_t kWirePacedMaxTokens = 2048;
  static constexpr int64_t kWirePacedMinTokens = 256;
  // Upload/download slots of a streaming call: a wire-paced one gets a third,
  // so that the fill of chunk i+2 need not wait until chunk i's grad_input
  // was handed to the transport (FLCE_CUDA_WIRE_SLOTS=2 keeps two).
  static constexpr int kStreamSlots = 2;
  static constexpr int kWirePacedSlots = 3;
  // A chunk's grad_input reaches the engine's sink in pieces of at most this
  // many bytes (at least one row), so a transport starts sending before a
  // large chunk was copied out of its slot.
  static constexpr int64_t kGradInputPieceBytes = int64_t{8} << 20;
};
static_assert(ChunkPolicy::kMaxTokens % ChunkPolicy::kTokenAlign == 0, "aligned max chunk");

struct RowKernelPolicy {
  // One block per logits row; each thread handles kVec consecutive fp32
  // columns per step (one 16-byte load). Four loads in flight per thread, or
  // a capped grid walking the rows, make this kernel slower, not faster
  // (docs/perf/cuda.md).
  static constexpr int kThreads = 512;
  static constexpr int kVec = 4;
  static constexpr int kTile = kThreads * kVec;
};
static_assert(RowKernelPolicy::kThreads % 32 == 0, "whole warps");
static_assert(RowKernelPolicy::kVec == 4, "kernels use float4 loads");
static_assert(VocabPolicy::kAlign % RowKernelPolicy::kVec == 0, "rows start 16-byte aligned");

struct ClusterRowPolicy {
  // A row is split over a thread-block cluster; each block stages its
  // segment of fp32 logits in shared memory so the row is read from device
  // memory once. Small segments keep several blocks per SM, so that some
  // load while others compute (with 100 KiB segments, two blocks per SM, the
  // kernel runs at half the two-pass kernel's speed; docs/perf/cuda.md).
  static constexpr int kThreads = 256;
  static constexpr int kMaxCluster = 16;  // > 8 needs the non-portable opt-in (Hopper)
  static constexpr int64_t kMaxSegmentBytes = 48 * 1024;
};
static_assert(ClusterRowPolicy::kThreads % 32 == 0, "whole warps");
static_assert(ClusterRowPolicy::kMaxSegmentBytes % 16 == 0, "16-byte copies");

struct VocabSplitPolicy {
  // Vocab columns per split; the split's fp32 logits for every token of a
  // token chunk live in the workspace.
  static constexpr int64_t kMaxSplit = 32768;
  static constexpr int64_t kMinSplit = 1024;
  static constexpr int64_t kMaxTokens = 32768;
};
static_assert(VocabSplitPolicy::kMaxSplit % VocabPolicy::kAlign == 0, "aligned splits");
static_assert(VocabSplitPolicy::kMinSplit % VocabPolicy::kAlign == 0, "aligned splits");

struct FuseMNPolicy {
  // One block per (kTileM tokens x kTileN vocab) tile; kTileK hidden columns
  // per shared-memory stage.
  static constexpr int kTileM = 64;
  static constexpr int kTileN = 64;
  static constexpr int kTileK = 32;
  static constexpr int kThreads = 256;
};
static_assert(FuseMNPolicy::kTileM * FuseMNPolicy::kTileN == FuseMNPolicy::kThreads * 16,
              "each thread owns a 4x4 register tile");

inline int64_t PadVocab(int64_t v) {
  return (v + VocabPolicy::kAlign - 1) / VocabPolicy::kAlign * VocabPolicy::kAlign;
}

}  // namespace flce::cuda

#endif  // FLCE_KERNELS_CUDA_BASE_POLICY_H_
