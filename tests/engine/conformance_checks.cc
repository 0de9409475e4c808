#include "tests/engine/conformance_checks.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "gtest/gtest.h"
#include "tests/support/problem.h"

namespace flce::test {
namespace {

double OutputRounding(DType dtype) {
  switch (dtype) {
    case DType::kF32: return 0.0;
    case DType::kBF16: return std::ldexp(1.0, -8);
    case DType::kF16: return std::ldexp(1.0, -11);
  }
  return 0.0;
}

double ScalarError(double a, double b) { return RelativeError({a}, {b}); }

}  // namespace

Tolerance ToleranceFor(const std::string& engine, DType head_dtype, DType hidden_dtype,
                       int64_t num_tokens) {
  Tolerance tol;
  if (engine == "cpu") {
    tol.grad = 1e-5;
    tol.loss = 1e-5;
  } else if (head_dtype == DType::kF32 && hidden_dtype == DType::kF32) {
    tol.grad = 2e-3;
    tol.loss = 2e-3;
    tol.argmax_mismatches = std::max<int64_t>(1, num_tokens / 50);
  } else {
    tol.grad = 5e-3;
    tol.loss = 1e-4;
    tol.argmax_mismatches = std::max<int64_t>(1, num_tokens / 50);
  }
  tol.grad_input = std::max(tol.grad, OutputRounding(hidden_dtype));
  return tol;
}

void ExpectMatchesReference(const EngineRun& run, const ReferenceOutput& ref,
                            const ComputeSpec& spec, const Tolerance& tol) {
  const ComputeResult& r = run.result;
  EXPECT_EQ(r.n_valid, ref.n_valid);
  EXPECT_LE(ScalarError(r.loss, ref.loss), tol.loss) << "loss " << r.loss << " vs " << ref.loss;
  EXPECT_LE(ScalarError(r.z_loss, ref.z_loss), tol.loss)
      << "z_loss " << r.z_loss << " vs " << ref.z_loss;
  EXPECT_LE(ScalarError(r.entropy_sum, ref.entropy_sum), tol.loss)
      << "entropy_sum " << r.entropy_sum << " vs " << ref.entropy_sum;
  EXPECT_LE(std::abs(r.n_correct - ref.n_correct), tol.argmax_mismatches)
      << "n_correct " << r.n_correct << " vs " << ref.n_correct;
  EXPECT_FALSE(r.strategy_used.empty());
  if (std::getenv("FLCE_TEST_PRINT_ERRORS") != nullptr) {
    std::fprintf(stderr, "  errors: loss %.2e grad_input %.2e grad_W %.2e grad_b %.2e logprob %.2e\n",
                 ScalarError(r.loss, ref.loss),
                 spec.outputs.grad_input ? RelativeError(run.grad_input, ref.grad_input) : 0.0,
                 run.grad_weight.empty() ? 0.0 : RelativeError(run.grad_weight, ref.grad_weight),
                 run.grad_bias.empty() ? 0.0 : RelativeError(run.grad_bias, ref.grad_bias),
                 spec.outputs.logprob ? RelativeError(ToDoubles(r.logprob), ref.logprob) : 0.0);
  }

  if (spec.outputs.grad_input) {
    EXPECT_LE(RelativeError(run.grad_input, ref.grad_input), tol.grad_input) << "grad_input";
  }
  if (!run.grad_weight.empty()) {
    EXPECT_LE(RelativeError(run.grad_weight, ref.grad_weight), tol.grad) << "grad_W";
  }
  if (!run.grad_bias.empty()) {
    EXPECT_LE(RelativeError(run.grad_bias, ref.grad_bias), tol.grad) << "grad_b";
  }
  if (spec.outputs.per_token_loss) {
    EXPECT_LE(RelativeError(ToDoubles(r.per_token_loss), ref.per_token_loss), tol.loss)
        << "per_token_loss";
  }
  if (spec.outputs.logprob) {
    EXPECT_LE(RelativeError(ToDoubles(r.logprob), ref.logprob), tol.loss) << "logprob";
  }
  if (spec.outputs.entropy) {
    EXPECT_LE(RelativeError(ToDoubles(r.entropy), ref.entropy), tol.loss) << "entropy";
  }
  if (spec.outputs.accuracy) {
    ASSERT_EQ(r.correct.size(), ref.correct.size());
    int64_t mismatches = 0;
    for (size_t t = 0; t < ref.correct.size(); ++t) mismatches += r.correct[t] != ref.correct[t];
    EXPECT_LE(mismatches, tol.argmax_mismatches) << "per-token correct";
  }
}

}  // namespace flce::test
