#include "kernels/cpu/chunk_kernel.h"

#include <cblas.h>

#include <chrono>

#include "core/status_macros.h"

namespace flce::cpu {
namespace {

// Adds the time since `since` to `total` and restarts the clock.
void Lap(std::chrono::steady_clock::time_point& since, double& total) {
  const auto now = std::chrono::steady_clock::now();
  total += std::chrono::duration<double, std::milli>(now - since).count();
  since = now;
}

}  // namespace

absl::Status RunChunk(CpuContext& ctx, const CpuHead& head, const LossOptions& options,
                      const ChunkArgs& args) {
  const int64_t M = args.rows;
  const int64_t V = head.spec().vocab_size;
  const int64_t H = head.spec().hidden_size;
  if (M == 0) return absl::OkStatus();
  FLCE_RETURN_IF_ERROR(ctx.Reserve(M, V, H));
  // OpenBLAS's thread count is process-wide; engines with different configs
  // may share the process, so each chunk sets its own (cheap when unchanged).
  openblas_set_num_threads(ctx.threads);
  float* logits = ctx.logits.data();
  const float* W = head.weight();
  PhaseTimes& times = ctx.phase_times;
  ++times.chunks;
  auto clock = std::chrono::steady_clock::now();

  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, V, H, 1.0f, args.hidden, H, W, H,
              0.0f, logits, V);
  Lap(clock, times.logits_gemm);

  const bool want_dr = args.want_grad_input || args.grad != nullptr;
  RowPassParams params;
  params.vocab_size = V;
  params.bias = head.bias();
  params.options = options;
  params.policy = args.policy;
  // Rows are independent: one row per block balances best.
  ctx.pool.ParallelFor(M, 1, [&](int thread, int64_t begin, int64_t end) {
    float* scratch = ctx.scratch.data() + thread * kRowScratchPerVocab * V;
    for (int64_t i = begin; i < end; ++i) {
      args.stats[i] = ProcessRow(params, logits + i * V, scratch, args.targets[i],
                                 args.token_weights[i], args.entropy_weights[i], want_dr,
                                 args.policy_rows != nullptr ? &args.policy_rows[i] : nullptr);
    }
  });
  Lap(clock, times.row_pass);
  if (!want_dr) return absl::OkStatus();

  if (args.want_grad_input) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, H, V, 1.0f, logits, V, W, H, 0.0f,
                ctx.grad_input.data(), H);
    Lap(clock, times.grad_input_gemm);
  }
  if (args.grad != nullptr) {
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, V, H, M, 1.0f, logits, V, args.hidden,
                H, 1.0f, args.grad->weight(), H);
    Lap(clock, times.grad_weight_gemm);
    if (float* grad_bias = args.grad->bias(); grad_bias != nullptr) {
      // Each block of columns adds its rows in token order, whoever runs it.
      ctx.pool.ParallelFor(V, 2048, [&](int, int64_t begin, int64_t end) {
        for (int64_t i = 0; i < M; ++i) {
          const float* row = logits + i * V;
          for (int64_t j = begin; j < end; ++j) grad_bias[j] += row[j];
        }
      });
      Lap(clock, times.grad_bias);
    }
  }
  return absl::OkStatus();
}

}  // namespace flce::cpu
