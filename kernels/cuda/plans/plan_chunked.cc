// The chunked (and separate) plan: chunks of tokens, each through the whole
// vocabulary. Plain logits on supported heads take the logits-stats GEMM
// (and, for bf16 heads, the row-scaled backward); everything else the fp32
// logits GEMM, a row kernel writing dlogits in place, and the cuBLAS backward.
#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "kernels/cuda/base/device_memory.h"
#include "kernels/cuda/base/policy.h"
#include "kernels/cuda/ops/cluster_row_kernel.cuh"
#include "kernels/cuda/ops/elementwise_kernels.cuh"
#include "kernels/cuda/ops/fused_row_kernel.cuh"
#include "kernels/cuda/ops/row_scaled_backward.cuh"
#include "kernels/cuda/ops/sm90/backward_gemm.cuh"
#include "kernels/cuda/ops/sm90/logits_stats_gemm.cuh"
#include "kernels/cuda/ops/tile_stats_kernels.cuh"
#include "kernels/cuda/plans/kernel_report.h"
#include "kernels/cuda/plans/plan_parts.h"

namespace flce::cuda {

using namespace plan_parts;  // NOLINT(build/namespaces): the plans' shared parts

namespace {

// The chunked plan's row kernel: single-pass cluster when chosen and the
// row fits a cluster, else the two-pass kernel.
absl::Status LaunchRows(const Exec& exec, const HeadView& head, const FusedRowArgs& args,
                        cudaStream_t stream) {
  absl::Status st = absl::FailedPreconditionError("cluster kernel not chosen");
  if (ClusterRowsChosen(SwitchesOf(exec))) {
    st = LaunchClusterRows(head.dtype, args, stream, exec.health);
  }
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
    a.in = ShiftRows(a.in, first[h]);
    a.out = ShiftRows(a.out, first[h]);
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

// The row reference M_t = x_t . W_y serves bf16 heads whose options keep
// dlogits one scale per row away from e (DlogitsScalePerRow: no label
// smoothing) and without entropy weights: with a backward, the row-scaled
// one; without (a forward-only call, a preference objective's first pass), the
// same GEMM and finish, which lets the call take the ping-pong kernel. The
// dlogits_pass switch keeps the plain e and the dlogits pass (tests compare
// both).
bool UseRowReference(const KernelSwitches& k, const HeadView& head, const DeviceRequest& r) {
  if (k.dlogits_pass) return false;
  return RowScaledCapable(head) && r.grad_bias == nullptr && DlogitsScalePerRow(r.params) &&
         !r.params.entropy_weighted;
}

// The own grad_input GEMM's arguments for a chunk of `rows`: where rows x H
// leaves SMs idle the vocabulary is split, each range into its own slab in
// the partials region (dead after the finish); one split writes q.grad_input.
GradInputGemmArgs OwnGradInputArgs(const HeadView& head, const TileScratch& s, int64_t rows) {
  const int64_t slab_bytes = std::max<int64_t>(rows * head.hidden * 4, 1);
  const int room = static_cast<int>(std::min<int64_t>(s.partials_bytes / slab_bytes, 4));
  GradInputGemmArgs a;
  a.d = s.exp_dlogits;
  a.w = head.weight;
  a.rows = rows;
  a.cols = head.padded_vocab;
  a.hidden = head.hidden;
  a.splits = GradInputSplits(rows, head.hidden, head.padded_vocab, room);
  a.out = a.splits > 1 ? static_cast<float*>(s.partials) : s.scaled.grad_input;
  return a;
}

// The row-scaled chunk's backward GEMMs over E and the row scales around
// them. Where both GEMMs are the own kernels the ping-pong grad_W starts
// beside grad_input, on the SMs its last wave leaves idle
// (GradWeightGemmArgs::beside_grad_input); otherwise one after the other.
struct RowScaledGemms {
  bool own_grad_input = false;
  bool own_grad_weight = false;
  bool beside = false;  // grad_W launched beside grad_input
  GradInputGemmArgs grad_input;
};

RowScaledGemms ChooseRowScaledGemms(const KernelSwitches& k, const HeadView& head,
                                    const TileScratch& s, const DeviceRequest& r) {
  RowScaledGemms g;
  g.own_grad_weight =
      r.grad_weight != nullptr && UseOwnGradWeightGemm(k, head.dtype, r.rows, head.hidden);
  const bool may_be_beside = g.own_grad_weight && GradWeightBesideGradInput(k);
  if (r.grad_input != nullptr) {
    g.grad_input = OwnGradInputArgs(head, s, r.rows);
    g.own_grad_input = UseOwnGradInputGemm(k, head.dtype, r.rows, head.hidden,
                                           g.grad_input.splits, may_be_beside);
  }
  g.beside = may_be_beside && g.own_grad_input;
  return g;
}

// grad_input = E W into q.grad_input (or the split slabs); returns the slabs' count.
absl::StatusOr<int> GradInputGemm(const Exec& exec, const HeadView& head, const TileScratch& s,
                                  const DeviceRequest& r, const RowScaledGemms& g) {
  if (g.own_grad_input) {
    FLCE_RETURN_IF_ERROR(LaunchGradInputGemm(head.dtype, g.grad_input, exec.stream, exec.health));
    return g.grad_input.splits;
  }
  FLCE_RETURN_IF_ERROR(MakeGemm(exec, head)
                           .GradInput(s.exp_dlogits, head.padded_vocab, head.weight, r.rows,
                                      head.padded_vocab, head.hidden, s.scaled.grad_input,
                                      DType::kF32, 0.0f));
  return 1;
}

absl::Status GradWeightGemm(const Exec& exec, const HeadView& head, const TileScratch& s,
                            const DeviceRequest& r, const RowScaledGemms& g) {
  if (!g.own_grad_weight) {
    return MakeGemm(exec, head)
        .GradWeight(s.exp_dlogits, head.padded_vocab, s.scaled.x_scaled, r.rows, head.padded_vocab,
                    head.hidden, r.grad_weight);
  }
  const KernelSwitches& k = SwitchesOf(exec);
  GradWeightGemmArgs a;
  a.kernel = GradWeightKernelOf(k);
  a.d = s.exp_dlogits;
  a.x = s.scaled.x_scaled;
  a.rows = r.rows;
  a.cols = head.padded_vocab;
  a.hidden = head.hidden;
  a.gw = r.grad_weight;
  if (g.beside) {
    a.tile_counter = s.scaled.tile_counter;  // zeroed before grad_input
    a.beside_grad_input = true;
  } else {
    a.cta_pairs = a.kernel == GradWeightKernel::kPingPong && GradWeightPairs(k);
  }
  return LaunchGradWeightGemm(head.dtype, a, exec.stream, exec.health);
}

// grad_input: the slabs summed and scaled by K_t into the request's dtype.
absl::Status ScaleGradInput(const Exec& exec, const HeadView& head, const TileScratch& s,
                            const DeviceRequest& r, int parts) {
  const RowScaledScratch& q = s.scaled;
  const float* slabs = parts > 1 ? static_cast<const float*>(s.partials) : q.grad_input;
  return LaunchScaleRows(DType::kF32, slabs, r.hidden_dtype, r.grad_input, r.rows, head.hidden,
                         q.scale, q.fallback, exec.stream, exec.health, parts);
}

// grad_W's second operand: the hidden rows scaled by K_t.
absl::Status ScaleHidden(const Exec& exec, const HeadView& head, const TileScratch& s,
                         const DeviceRequest& r, const void* x) {
  const RowScaledScratch& q = s.scaled;
  return LaunchScaleRows(head.dtype, x, head.dtype, q.x_scaled, r.rows, head.hidden, q.scale,
                         q.fallback, exec.stream, exec.health);
}

absl::Status RowScaledBackward(const Exec& exec, const HeadView& head, const TileScratch& s,
                               const DeviceRequest& r, const void* x) {
  const RowScaledGemms g = ChooseRowScaledGemms(SwitchesOf(exec), head, s, r);
  if (g.beside) {
    // Nothing may stand between the two GEMMs on the stream: grad_W starts
    // beside grad_input only as the kernel right after it.
    FLCE_RETURN_IF_ERROR(ScaleHidden(exec, head, s, r, x));
    MarkStage(exec, "hidden_scale");
    FLCE_CUDA_RETURN_IF_ERROR(
        cudaMemsetAsync(s.scaled.tile_counter, 0, sizeof(int32_t), exec.stream), exec.health);
    FLCE_ASSIGN_OR_RETURN(const int parts, GradInputGemm(exec, head, s, r, g));
    FLCE_RETURN_IF_ERROR(GradWeightGemm(exec, head, s, r, g));
    MarkStage(exec, "grad_input_and_grad_weight_gemms");
    FLCE_RETURN_IF_ERROR(ScaleGradInput(exec, head, s, r, parts));
    MarkStage(exec, "grad_input_scale");
    return absl::OkStatus();
  }
  if (r.grad_input != nullptr) {
    FLCE_ASSIGN_OR_RETURN(const int parts, GradInputGemm(exec, head, s, r, g));
    MarkStage(exec, "grad_input_gemm");
    FLCE_RETURN_IF_ERROR(ScaleGradInput(exec, head, s, r, parts));
    MarkStage(exec, "grad_input_scale");
  }
  if (r.grad_weight != nullptr) {
    FLCE_RETURN_IF_ERROR(ScaleHidden(exec, head, s, r, x));
    MarkStage(exec, "hidden_scale");
    FLCE_RETURN_IF_ERROR(GradWeightGemm(exec, head, s, r, g));
    MarkStage(exec, "grad_weight_gemm");
  }
  return absl::OkStatus();
}

// The same chunk without the dlogits pass (row_scaled_backward.cuh): e
// relative to M_t = x_t . W_y, one scale per row applied around the two
// backward GEMMs (own or cuBLAS: backward_gemm.cuh), if the call has any. Rows it cannot serve
// raise a device flag; the launches after the finish then redo the chunk on the dlogits-pass path
// (each reads the flag and returns at once in the common case).
absl::Status RunRowReferenceChunk(const Exec& exec, const HeadView& head, const TileScratch& s,
                                  const DeviceRequest& r, const void* x, LogitsStatsArgs g,
                                  TileRowArgs t) {
  const RowScaledScratch& q = s.scaled;
  FLCE_RETURN_IF_ERROR(LaunchRowReference(head.dtype, x, head.weight, r.in.target, r.rows,
                                          head.hidden, q.reference, q.fallback, exec.stream,
                                          exec.health));
  MarkStage(exec, "row_reference");
  g.row_reference = q.reference;
  g.store_e = WantsBackward(r);
  FLCE_RETURN_IF_ERROR(LaunchLogitsStats(head.dtype, g, exec.stream, exec.health));
  MarkStage(exec, "logits_stats_gemm");
  TileRowArgs scaled = t;
  scaled.row_reference = q.reference;
  scaled.row_scale = q.scale;
  scaled.fallback = q.fallback;
  scaled.sums_around_reference = PartialsAroundReference(g);
  FLCE_RETURN_IF_ERROR(LaunchTileFinish(scaled, exec.stream, exec.health));
  MarkStage(exec, "row_finish");
  // The fallback: fp16 e per tile, the plain finish, the dlogits pass.
  g.row_reference = nullptr;
  g.run_if = q.fallback;
  t.run_if = q.fallback;
  FLCE_RETURN_IF_ERROR(LaunchLogitsStats(head.dtype, g, exec.stream, exec.health));
  FLCE_RETURN_IF_ERROR(LaunchTileFinish(t, exec.stream, exec.health));
  if (!WantsBackward(r)) {
    MarkStage(exec, "fallback_checks");
    return absl::OkStatus();
  }
  FLCE_RETURN_IF_ERROR(LaunchTileGrad(head.dtype, t, exec.stream, exec.health));
  MarkStage(exec, "fallback_checks");
  // E is now either row-scaled e (with the target entries rewritten) or
  // dlogits; the scale kernels apply K_t or 1 accordingly.
  return RowScaledBackward(exec, head, s, r, x);
}

// One chunk on the logits-stats path: GEMM + partials, row finish, dlogits
// in place of e, then the cuBLAS backward over the 16-bit dlogits.
absl::Status RunTileStatsChunk(const Exec& exec, const HeadView& head, const Plan& plan,
                               const DeviceRequest& r, char* scratch) {
  if (!PlainLogits(r.params) || head.bias != nullptr) {
    return absl::InternalError("logits-stats plan given a logit transform");
  }
  const TokenBytes tb = PerTokenBytes(head, r.hidden_dtype, false);
  const TileScratch s = CarveTile(scratch, plan.chunk_tokens, head, tb);
  FLCE_ASSIGN_OR_RETURN(const void* x, HeadDtypeHidden(exec, head, r, s.rest));
  MarkStage(exec, "hidden_convert");
  LogitsStatsArgs g;
  TileRowArgs t;
  TileChunkArgs(head, r, s, x, SwitchesOf(exec), &g, &t);
  if (UseRowReference(SwitchesOf(exec), head, r)) {
    return RunRowReferenceChunk(exec, head, s, r, x, g, t);
  }
  FLCE_RETURN_IF_ERROR(LaunchLogitsStats(head.dtype, g, exec.stream, exec.health));
  FLCE_RETURN_IF_ERROR(LaunchTileFinish(t, exec.stream, exec.health));
  if (!WantsBackward(r)) return absl::OkStatus();
  FLCE_RETURN_IF_ERROR(LaunchTileGrad(head.dtype, t, exec.stream, exec.health));
  return Backward(exec, head, r, s.rest, x, s.exp_dlogits, head.padded_vocab);
}

}  // namespace

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
  TileChunkArgs(head, r, s, launch.x, plan.switches, &launch.gemm, &launch.rows);
  launch.row_reference = s.scaled.reference;
  launch.fallback = s.scaled.fallback;
  if (s.scaled.grad_input != nullptr) launch.own_grad_input = OwnGradInputArgs(head, s, r.rows);
  return launch;
}

absl::Status RunChunk(const Exec& exec_given, const HeadView& head, const Plan& plan,
                      const DeviceRequest& r, char* scratch) {
  if (r.rows > plan.chunk_tokens) return absl::InternalError("chunk larger than the plan's");
  const Exec exec = ExecUnder(exec_given, plan);
  if (plan.tile_stats) return RunTileStatsChunk(exec, head, plan, r, scratch);
  const TokenBytes tb = PerTokenBytes(head, r.hidden_dtype, false);
  const Scratch s = Carve(scratch, plan.chunk_tokens, head.padded_vocab, tb, head, false, false);
  FLCE_ASSIGN_OR_RETURN(const void* x, HeadDtypeHidden(exec, head, r, s));
  const bool backward = WantsBackward(r);
  const bool overlap =
      backward && OverlapChosen(plan.switches, r.rows) && exec.side != nullptr;
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
  if (overlap) {
    return RunChunkOverlapped(exec, head, r, s, x, args, ld_d);
  }
  FLCE_RETURN_IF_ERROR(LaunchRows(exec, head, args, exec.stream));
  if (!backward) return absl::OkStatus();
  return Backward(exec, head, r, s, x, s.logits, ld_d);
}

std::string DescribeChunkKernels(const Exec& exec_given, const HeadView& head, const Plan& plan,
                                 const DeviceRequest& r) {
  const Exec exec = ExecUnder(exec_given, plan);
  const KernelSwitches& k = plan.switches;
  std::string logits = "cublas_fp32";
  std::string rows;
  std::string grad_input = "cublas";
  std::string grad_weight = CublasGradWeightWords(exec, head, r.rows);
  if (plan.tile_stats) {
    TileScratch s;
    s.partials_bytes = TilePartialsBytes(plan.chunk_tokens, head);
    LogitsStatsArgs g;
    TileRowArgs t;
    TileChunkArgs(head, r, s, nullptr, k, &g, &t);
    logits = "stats_cooperative";
    rows = "tile_finish+dlogits_pass";
    if (UseRowReference(k, head, r)) {
      static const float kAnyReference = 0.0f;  // asked of, never launched
      g.row_reference = &kAnyReference;
      if (const int cols = PingPongColsFor(g); cols > 0) {
        const bool pairs = g.pingpong_pairs && cols == 192;
        logits = absl::StrCat("stats_pingpong", cols, pairs ? "_pairs" : "");
      }
      rows = "row_reference";
      const RowScaledGemms gemms = ChooseRowScaledGemms(k, head, s, r);
      if (gemms.own_grad_input) grad_input = absl::StrCat("own_splits", gemms.grad_input.splits);
      if (gemms.own_grad_weight) {
        const bool cooperative = GradWeightKernelOf(k) == GradWeightKernel::kCooperative;
        grad_weight = cooperative        ? "own_cooperative"
                      : gemms.beside     ? "own_pingpong_beside"
                      : GradWeightPairs(k) ? "own_pingpong_pairs"
                                           : "own_pingpong";
      }
    }
  } else {
    rows = ClusterRowsChosen(k) && ClusterRowsFit(head.padded_vocab) ? "cluster" : "two_pass";
    if (WantsBackward(r) && OverlapChosen(k, r.rows) && exec.side != nullptr) {
      rows += "+half_chunk_overlap";
    }
  }
  return KernelWords(logits, rows, r, grad_input, grad_weight);
}

}  // namespace flce::cuda
