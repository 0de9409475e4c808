#include "bench/cpu/engine_timing.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <random>

#include "core/status_macros.h"

namespace flce::bench {
namespace {

std::string RandomBytes(DType dtype, int64_t n, double scale, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, static_cast<float>(scale));
  std::vector<float> values(n);
  for (float& v : values) v = normal(rng);
  std::string bytes(n * DTypeSize(dtype), '\0');
  FromFloat(dtype, values.data(), bytes.data(), n);
  return bytes;
}

}  // namespace

absl::StatusOr<std::unique_ptr<EngineBench>> EngineBench::Create(Engine& engine,
                                                                const BenchProblem& problem) {
  std::unique_ptr<EngineBench> bench(new EngineBench(engine, problem));
  const int64_t V = problem.vocab_size;
  const int64_t H = problem.hidden_size;
  HeadSpec spec{V, H, problem.dtype, false};
  FLCE_ASSIGN_OR_RETURN(std::unique_ptr<HeadBuilder> builder, engine.BeginHead(spec));
  const std::string weight = RandomBytes(problem.dtype, V * H, 1.0 / std::sqrt(H), 11);
  FLCE_RETURN_IF_ERROR(builder->WriteWeight(0, weight.data(), weight.size()));
  FLCE_ASSIGN_OR_RETURN(bench->head_, builder->Finish());
  FLCE_ASSIGN_OR_RETURN(bench->grad_, engine.NewGradBuffer(spec));
  bench->hidden_ = RandomBytes(problem.dtype, problem.num_tokens * H, 1.0, 12);
  std::mt19937_64 rng(13);
  std::uniform_int_distribution<int32_t> target(0, static_cast<int32_t>(V - 1));
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  bench->targets_.resize(problem.num_tokens);
  for (int32_t& y : bench->targets_) y = unit(rng) < 0.05 ? -100 : target(rng);
  return bench;
}

absl::StatusOr<double> EngineBench::RunOnce(bool backward) {
  ComputeSpec spec;
  spec.num_tokens = problem_.num_tokens;
  spec.hidden_dtype = problem_.dtype;
  spec.targets = targets_;
  spec.chunk_tokens = problem_.chunk_tokens;
  spec.options = problem_.options;
  spec.outputs.grad_input = backward;
  spec.grad_out = backward ? grad_.get() : nullptr;
  std::atomic<int64_t> rows_back{0};
  const auto start = std::chrono::steady_clock::now();
  FLCE_ASSIGN_OR_RETURN(
      std::unique_ptr<ComputeCall> call,
      engine_.StartCompute(head_, spec, [&rows_back](int64_t, int64_t rows, std::string) {
        rows_back += rows;
      }));
  const int64_t row_bytes = problem_.hidden_size * DTypeSize(problem_.dtype);
  for (int64_t t = 0; t < problem_.num_tokens; t += problem_.rows_per_block) {
    const int64_t rows = std::min(problem_.rows_per_block, problem_.num_tokens - t);
    FLCE_RETURN_IF_ERROR(call->AddHidden(t, rows, hidden_.data() + t * row_bytes));
  }
  FLCE_ASSIGN_OR_RETURN(ComputeResult result, call->Finish());
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  if (!std::isfinite(result.loss)) return absl::InternalError("loss is not finite");
  if (backward && rows_back.load() != problem_.num_tokens) {
    return absl::InternalError("grad_input rows missing");
  }
  return ms;
}

}  // namespace flce::bench
