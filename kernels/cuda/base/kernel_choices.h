// Which kernels the CUDA engine runs, decided in one place: the FLCE_CUDA_*
// switches an operator, a test or the benchmark sets, read once when a plan
// is made (Plan::switches), and the shape thresholds that pick a kernel where
// no switch does. Every launch decides through these functions with its
// plan's switches, and the plan's report (DescribeChunkKernels, plans/plans.h)
// asks the same functions, so what a call reports is what its chunks ran.
// Two choices live beside the code they size: the cuBLAS grad_W tile list
// and where it applies (ops/gemm_algos.h), and the own grad_input GEMM's
// vocabulary splits (GradInputSplits, ops/sm90/backward_gemm.cuh).
//
// Switches (unset or empty = the default; a value not listed here, or an
// FLCE_CUDA_ name that is none of these, FLCE_CUDA_GEMM_TILES and
// FLCE_CUDA_PLUGIN, fails the engine's creation, CheckKernelSwitchSpellings;
// 0 and 1 both spell the on/off ones):
//   FLCE_CUDA_GENERIC=1            the plans of GPUs before Hopper (no own
//                                  kernels: the conformance suite's A100 path)
//   FLCE_CUDA_LOGITS=cublas        fp32 logits from cuBLAS, not the stats GEMM
//   FLCE_CUDA_STATS_KERNEL=cooperative | pingpong128 | pingpong192 (pingpong)
//   FLCE_CUDA_STATS_PAIRS=0        the 192-column stats kernel without CTA pairs
//   FLCE_CUDA_STATS_GROUP=G        token tiles per group of the stats GEMM
//   FLCE_CUDA_ROW_KERNEL=cluster   the single-pass cluster row kernel
//   FLCE_CUDA_OVERLAP=1            the fp32 path's half-chunk row overlap
//   FLCE_CUDA_DLOGITS_PASS=1       no row reference: e, then the dlogits pass
//   FLCE_CUDA_BACKWARD=own | cublas
//   FLCE_CUDA_GRAD_WEIGHT=pingpong | cooperative | cublas
//   FLCE_CUDA_BACKWARD_OVERLAP=0   the own grad_W never beside grad_input
//   FLCE_CUDA_GRAD_WEIGHT_PAIRS=0  the own grad_W without CTA pairs
//   FLCE_CUDA_THIN_GRAD_WEIGHT=0   cuBLAS for grad_W of a few tokens too
//   FLCE_CUDA_GEMM_TILES=...       cuBLAS grad_W tiles (gemm_algos.h)
//   FLCE_CUDA_WIRE_SLOTS=2 | 3     upload/download slots of a wire-paced call
#ifndef FLCE_KERNELS_CUDA_BASE_KERNEL_CHOICES_H_
#define FLCE_KERNELS_CUDA_BASE_KERNEL_CHOICES_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "core/dtype.h"

namespace flce::cuda {

enum class StatsKernelSwitch { kAuto, kCooperative, kPingPong128, kPingPong192 };
// The backward GEMMs: the own kernels where the device and head allow and the
// problem fills the GPU (kAuto), always where they can (kOwn), or cuBLAS.
enum class BackwardGemmChoice { kAuto, kOwn, kCublas };
enum class GradWeightSwitch { kAuto, kCublas, kPingPong, kCooperative };
// The own grad_W GEMM's kernel (backward_gemm.cuh).
enum class GradWeightKernel { kPingPong, kCooperative };

struct KernelSwitches {
  bool generic = false;
  bool cublas_logits = false;
  StatsKernelSwitch stats_kernel = StatsKernelSwitch::kAuto;
  bool stats_pairs = true;
  int stats_group = 0;  // 0: one group, the whole chunk
  bool cluster_rows = false;
  bool overlap = false;
  bool dlogits_pass = false;
  BackwardGemmChoice backward = BackwardGemmChoice::kAuto;
  GradWeightSwitch grad_weight = GradWeightSwitch::kAuto;
  bool backward_overlap = true;
  bool grad_weight_pairs = true;
  bool thin_grad_weight = true;
  std::string gemm_tiles;  // empty: unset (gemm_algos.h's default list)
  int wire_slots = 0;      // 0: ChunkPolicy::kWirePacedSlots
};

KernelSwitches KernelSwitchesFromEnvironment();
// INVALID_ARGUMENT naming the variable: the first FLCE_CUDA_ variable set to
// something that no part of the engine reads (a misspelt or retired switch),
// else the first switch set to a value KernelSwitchesFromEnvironment would
// read as the default without being asked to, with the spellings it takes
// (FLCE_CUDA_GEMM_TILES aside: GemmAlgos::Create checks its list).
absl::Status CheckKernelSwitchSpellings();
// *s, or the defaults (every switch unset) where s is null.
const KernelSwitches& SwitchesOrDefaults(const KernelSwitches* s);

// Token rows of the stats GEMM's and the own backward GEMMs' tiles.
inline constexpr int64_t kOwnTileRows = 128;
// At most this many tokens, grad_W streams W's gradient rows once
// (thin_grad_weight.cuh) instead of a GEMM.
inline constexpr int64_t kThinGradWeightRows = 8;
// Below this many tokens a chunk's backward stays on cuBLAS's thin-product
// kernels, own GEMMs and preferred tiles alike.
inline constexpr int64_t kOwnBackwardMinRows = 2048;
// Up to this H the own grad_W starts beside the own grad_input by default
// (the two defaults below decide together); above it grad_W runs alone.
inline constexpr int64_t kBesideMaxHidden = 2048;

// The Hopper kernels (stats GEMM, own backward GEMMs, cluster rows) for a
// head on this device (HeadFitsHopperKernels), unless the switches ask for
// the generic plans.
bool HopperKernelsFor(const KernelSwitches& s, DType dtype, int64_t hidden);

// The logits-stats GEMM for a head with plain logits.
bool LogitsStatsChosen(const KernelSwitches& s, DType dtype, int64_t hidden);
// The default call's stats kernel (row-scaled e around the row reference,
// neither entropy nor accuracy): the ping-pong kernel's tile width (192
// columns) where the chunk fills at least 3/4 of a token tile; 0 = the
// cooperative kernel, quicker where a chunk only streams W.
int StatsPingPongCols(const KernelSwitches& s, int64_t rows);
// The 192-column ping-pong kernel in CTA pairs sharing W, for chunks of more
// than one token tile.
bool StatsPingPongPairs(const KernelSwitches& s, int64_t rows);
// Token tiles per group of the stats GEMM (m_tiles: the whole chunk).
int32_t StatsTokenTilesPerGroup(const KernelSwitches& s, int32_t m_tiles);

// The chunked fp32 path's row kernel: the single-pass cluster kernel (where
// a row fits a cluster) instead of the two-pass one.
bool ClusterRowsChosen(const KernelSwitches& s);
// The fp32 path's two half-chunks, rows of one beside the GEMMs of the other
// (a chunk of at least two token alignments, an engine with a side stream).
bool OverlapChosen(const KernelSwitches& s, int64_t rows);

// The own grad_input GEMM for `rows` tokens with the split count
// GradInputSplits chose, `grad_weight_beside` when the own grad_W would run
// beside it.
bool UseOwnGradInputGemm(const KernelSwitches& s, DType dtype, int64_t rows, int64_t hidden,
                         int splits, bool grad_weight_beside);
// kAuto's choice on a device that has the own kernels: where the vocabulary
// split fills the waves rows x H alone leaves part empty, or where grad_W
// beside it fills them, up to kBesideMaxHidden.
bool OwnGradInputByDefault(int64_t rows, int64_t hidden, int splits, bool grad_weight_beside);
// The own grad_W GEMM for `rows` tokens.
bool UseOwnGradWeightGemm(const KernelSwitches& s, DType dtype, int64_t rows, int64_t hidden);
// kAuto's choice on a device that has the own kernels: the ping-pong kernel
// where it runs beside the own grad_input (H from 1536 to kBesideMaxHidden).
bool OwnGradWeightByDefault(int64_t rows, int64_t hidden);
// Whether an own ping-pong grad_W may start beside the own grad_input.
bool GradWeightBesideGradInput(const KernelSwitches& s);
GradWeightKernel GradWeightKernelOf(const KernelSwitches& s);
// The ping-pong grad_W in CTA pairs where its tiles are not counted.
bool GradWeightPairs(const KernelSwitches& s);
// cuBLAS's grad_W product replaced by the streaming pass for a few tokens.
bool UseThinGradWeight(const KernelSwitches& s, int64_t rows);
// Upload/download slots of a chunked call whose hidden arrives at the wire's
// pace.
int WireSlots(const KernelSwitches& s);

}  // namespace flce::cuda

#endif  // FLCE_KERNELS_CUDA_BASE_KERNEL_CHOICES_H_
