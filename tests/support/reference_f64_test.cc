// Checks the float64 reference itself: its gradients against central finite
// differences of its own loss (every option on), and its loss against a case
// small enough to work out by hand.
#include "tests/support/reference_f64.h"

#include <cmath>
#include <functional>

#include "gtest/gtest.h"
#include "tests/support/problem.h"

namespace flce::test {
namespace {

// MATH.md's differentiated objective: grad_scale * sum_t (a_t l_t + e_t H_t).
double Objective(const ReferenceInput& in) {
  ReferenceOutput out = ComputeReference(in);
  double total = out.loss;
  for (int64_t t = 0; t < in.num_tokens; ++t) {
    double e = in.entropy_weights.empty() ? 0.0 : in.entropy_weights[t];
    total += e * out.entropy[t];
  }
  return in.options.grad_scale * total;
}

double FiniteDifference(ReferenceInput in, std::vector<double> ReferenceInput::*field,
                        size_t index) {
  const double step = 1e-6;
  const double saved = (in.*field)[index];
  (in.*field)[index] = saved + step;
  const double plus = Objective(in);
  (in.*field)[index] = saved - step;
  const double minus = Objective(in);
  return (plus - minus) / (2 * step);
}

ReferenceInput SmallInput(const LossOptions& options, Reduction reduction) {
  ProblemSpec ps;
  ps.vocab_size = 11;
  ps.hidden_size = 5;
  ps.num_tokens = 6;
  ps.has_bias = true;
  ps.ignore_fraction = 0.0;
  Problem problem = MakeProblem(ps);
  problem.targets[2] = ps.ignore_index;
  ComputeSpec spec;
  spec.reduction = reduction;
  spec.options = options;
  ReferenceInput in = MakeReferenceInput(problem, spec);
  in.entropy_weights = {0.3, -0.2, 0.5, 0.0, 0.1, 0.7};
  return in;
}

void ExpectGradientsMatchFiniteDifferences(const ReferenceInput& in) {
  ReferenceOutput out = ComputeReference(in);
  std::vector<double> fd_w, fd_h, fd_b;
  for (size_t i = 0; i < in.weight.size(); ++i) {
    fd_w.push_back(FiniteDifference(in, &ReferenceInput::weight, i));
  }
  for (size_t i = 0; i < in.hidden.size(); ++i) {
    fd_h.push_back(FiniteDifference(in, &ReferenceInput::hidden, i));
  }
  for (size_t i = 0; i < in.bias.size(); ++i) {
    fd_b.push_back(FiniteDifference(in, &ReferenceInput::bias, i));
  }
  EXPECT_LE(RelativeError(out.grad_weight, fd_w), 1e-7);
  EXPECT_LE(RelativeError(out.grad_input, fd_h), 1e-7);
  EXPECT_LE(RelativeError(out.grad_bias, fd_b), 1e-7);
}

TEST(ReferenceF64Test, GradientsMatchFiniteDifferencesPlain) {
  LossOptions options;
  ExpectGradientsMatchFiniteDifferences(SmallInput(options, Reduction::kMean));
}

TEST(ReferenceF64Test, GradientsMatchFiniteDifferencesEveryOption) {
  LossOptions options;
  options.label_smoothing = 0.1f;
  options.z_loss_scale = 1e-2f;
  options.softcap = 1.5f;
  options.temperature = 0.7f;
  options.grad_scale = 3.0f;
  for (Reduction reduction : {Reduction::kMean, Reduction::kSum, Reduction::kNone}) {
    ExpectGradientsMatchFiniteDifferences(SmallInput(options, reduction));
  }
}

TEST(ReferenceF64Test, GradientsMatchFiniteDifferencesTokenWeights) {
  LossOptions options;
  options.z_loss_scale = 1e-3f;
  ReferenceInput in = SmallInput(options, Reduction::kMean);
  in.token_weights = {0.5, -1.0, 2.0, 0.25, 1.5, -0.75};
  ExpectGradientsMatchFiniteDifferences(in);
}

TEST(ReferenceF64Test, TwoWayCaseByHand) {
  ReferenceInput in;
  in.vocab_size = 2;
  in.hidden_size = 1;
  in.num_tokens = 2;
  in.weight = {1.0, 2.0};
  in.hidden = {1.0, -1.0};
  in.targets = {0, 1};
  in.reduction = Reduction::kSum;
  ReferenceOutput out = ComputeReference(in);
  // Token 0: logits (1, 2), y = 0. Token 1: logits (-1, -2), y = 1.
  const double lse0 = std::log(std::exp(1.0) + std::exp(2.0));
  const double lse1 = std::log(std::exp(-1.0) + std::exp(-2.0));
  EXPECT_NEAR(out.per_token_loss[0], lse0 - 1.0, 1e-14);
  EXPECT_NEAR(out.per_token_loss[1], lse1 + 2.0, 1e-14);
  EXPECT_NEAR(out.loss, lse0 - 1.0 + lse1 + 2.0, 1e-14);
  EXPECT_EQ(out.n_valid, 2);
  EXPECT_EQ(out.n_correct, 0);  // argmax is 1 for token 0 and 0 for token 1
  // d/dh of token 0: sum_i (p_i - [i=0]) W_i = p_1 * (2 - 1).
  EXPECT_NEAR(out.grad_input[0], std::exp(2.0 - lse0), 1e-14);
}

TEST(ReferenceF64Test, ArgmaxTiesGoToLowestIndex) {
  ReferenceInput in;
  in.vocab_size = 3;
  in.hidden_size = 1;
  in.num_tokens = 1;
  in.weight = {0.5, 2.0, 2.0};
  in.hidden = {1.0};
  in.targets = {1};
  ReferenceOutput out = ComputeReference(in);
  EXPECT_EQ(out.n_correct, 1);
  in.targets = {2};
  EXPECT_EQ(ComputeReference(in).n_correct, 0);
}

// Two logits the softcap saturates to within fp32 rounding of each other make the token's
// `correct` uncertain; a clear winner or a clear loser does not.
TEST(ReferenceF64Test, NearTiesUnderTheSoftcapAreUncertain) {
  ReferenceInput in;
  in.vocab_size = 3;
  in.hidden_size = 1;
  in.num_tokens = 3;
  in.weight = {1.0, 80.0, 81.0};
  in.hidden = {1.0, 1.0, 1.0};
  in.targets = {2, 1, 0};
  in.options.softcap = 10.0f;
  ReferenceOutput out = ComputeReference(in);
  // tanh(8) and tanh(8.1) differ by 4e-8, less than an fp32 ulp at 1.
  EXPECT_EQ(out.correct, (std::vector<uint8_t>{1, 0, 0}));
  EXPECT_EQ(out.correct_uncertain, (std::vector<uint8_t>{1, 1, 0}));
  EXPECT_EQ(out.n_correct_uncertain, 2);

  in.options.softcap = 0.0f;  // 80 and 81 are far apart in fp32
  out = ComputeReference(in);
  EXPECT_EQ(out.correct, (std::vector<uint8_t>{1, 0, 0}));
  EXPECT_EQ(out.n_correct_uncertain, 0);
}

TEST(ReferenceF64Test, AllIgnoredUnderMeanGivesZeroLossAndZeroLossGradients) {
  ReferenceInput in = SmallInput(LossOptions{}, Reduction::kMean);
  for (int32_t& y : in.targets) y = in.ignore_index;
  in.entropy_weights.clear();
  ReferenceOutput out = ComputeReference(in);
  EXPECT_EQ(out.loss, 0.0);
  EXPECT_EQ(out.n_valid, 0);
  for (double g : out.grad_weight) EXPECT_EQ(g, 0.0);
  for (double g : out.grad_input) EXPECT_EQ(g, 0.0);
  EXPECT_GT(out.entropy_sum, 0.0);  // entropy needs no target
}

TEST(RelativeErrorTest, NanNeverPasses) {
  EXPECT_TRUE(std::isinf(RelativeError({1.0, NAN}, {1.0, 1.0})));
  EXPECT_TRUE(std::isinf(RelativeError({1.0}, {1.0, 1.0})));
  EXPECT_EQ(RelativeError({0.0, 0.0}, {0.0, 0.0}), 0.0);
  EXPECT_DOUBLE_EQ(RelativeError({3.0, 4.0}, {0.0, 0.0}), 5.0);
  EXPECT_DOUBLE_EQ(RelativeError({1.0, 1.0}, {1.0, 2.0}), 1.0 / std::sqrt(5.0));
}

}  // namespace
}  // namespace flce::test
