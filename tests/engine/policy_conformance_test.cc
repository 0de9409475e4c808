// MATH.md's policy objectives on every engine that computes them, against the
// float64 reference; engines without them refuse the call.
#include <cmath>
#include <limits>
#include <random>

#include "tests/engine/engine_test_fixture.h"

namespace flce::test {
namespace {

class PolicyConformanceTest : public EngineTest {
 protected:
  void SetUp() override {
    EngineTest::SetUp();
    if (IsSkipped()) return;
    if (!engine_->info().policy_objectives) {
      GTEST_SKIP() << "the " << engine_->info().name
                   << " engine does not compute policy objectives (PolicyRefusal checks that it "
                      "says so)";
    }
  }

  // A policy over `problem` whose old log-probs lie around the current ones
  // (log-ratios ~ N(0, spread)), so that ratios fall on both sides of the
  // clip bounds; advantages of both signs; ref_logp likewise; token-mean
  // weights over the valid targets.
  PolicyObjective PolicyFor(const Problem& problem, double spread = 0.3) {
    const ReferenceOutput plain = ComputeReference(MakeReferenceInput(problem, BaseSpec()));
    std::mt19937_64 rng(problem.seed + 17);
    std::normal_distribution<double> noise(0.0, spread);
    const int64_t n = problem.spec.num_tokens;
    PolicyObjective o;
    std::vector<uint8_t> counts(n);
    for (int64_t t = 0; t < n; ++t) {
      counts[t] = problem.targets[t] != problem.spec.ignore_index;
      o.old_logp.push_back(static_cast<float>(plain.logprob[t] + noise(rng)));
      o.advantages.push_back(static_cast<float>(noise(rng) / spread));
      o.ref_logp.push_back(static_cast<float>(plain.logprob[t] + noise(rng)));
    }
    // Planted on the first valid tokens, whatever the noise drew: a ratio above
    // 1 + clip_high with A > 0, one below 1 - clip_low with A < 0, and one far
    // above a dual clip of 3 with A < 0.
    const double planted[][2] = {{-0.5, 1.0}, {0.5, -1.0}, {-2.0, -1.0}};  // old - logp, A
    for (int64_t t = 0, k = 0; t < n && k < 3; ++t) {
      if (!counts[t]) continue;
      o.old_logp[t] = static_cast<float>(plain.logprob[t] + planted[k][0]);
      o.advantages[t] = static_cast<float>(planted[k][1]);
      ++k;
    }
    o.weights = *PolicyTokenWeights(LossAggregation::kTokenMean, counts, {}, 0.0);
    return o;
  }

  ComputeSpec SpecWith(PolicyObjective policy) const {
    ComputeSpec spec = BaseSpec();
    if (policy.kl_coef == 0.0f) policy.ref_logp.clear();
    spec.policy = std::move(policy);
    return spec;
  }
};

TEST_P(PolicyConformanceTest, ClippedSurrogateAsymmetric) {
  Problem problem = MakeProblem(ProblemSpec{});
  PolicyObjective o = PolicyFor(problem);
  o.clip_low = 0.2f;
  o.clip_high = 0.28f;  // DAPO's clip-higher
  ComputeSpec spec = SpecWith(o);
  ExpectConforms(problem, spec);
  // Clipping happened on both sides, or this test says nothing about it.
  const ReferenceOutput ref = ComputeReference(MakeReferenceInput(problem, spec));
  EXPECT_GT(ref.policy.clipped_low, 0);
  EXPECT_GT(ref.policy.clipped_high, 0);
}

TEST_P(PolicyConformanceTest, DualClip) {
  Problem problem = MakeProblem(ProblemSpec{});
  PolicyObjective o = PolicyFor(problem, 1.0);  // wide ratios: -A r beyond -c A on some
  o.dual_clip = 3.0f;
  ComputeSpec spec = SpecWith(o);
  ExpectConforms(problem, spec);
  EXPECT_GT(ComputeReference(MakeReferenceInput(problem, spec)).policy.dual_clipped, 0);
}

TEST_P(PolicyConformanceTest, Cispo) {
  Problem problem = MakeProblem(ProblemSpec{});
  PolicyObjective o = PolicyFor(problem);
  o.loss = PolicyLoss::kCispo;
  o.clip_low = 1.0f;  // no lower bound, as CISPO is usually run
  o.clip_high = 0.28f;
  ExpectConforms(problem, SpecWith(o));
}

TEST_P(PolicyConformanceTest, KlToAReferencePolicy) {
  Problem problem = MakeProblem(ProblemSpec{});
  for (KlEstimator estimator : {KlEstimator::kK1, KlEstimator::kK3}) {
    SCOPED_TRACE(KlEstimatorName(estimator));
    PolicyObjective o = PolicyFor(problem);
    o.kl_coef = 0.1f;
    o.kl_estimator = estimator;
    ExpectConforms(problem, SpecWith(o));
  }
}

// Log-ratios beyond the clamp: their ratio is exp(+-clamp) and carries no
// gradient (k3's own clamps likewise), and nothing overflows.
TEST_P(PolicyConformanceTest, LogRatioClampAndFarReference) {
  Problem problem = MakeProblem(ProblemSpec{});
  PolicyObjective o = PolicyFor(problem);
  o.log_ratio_clamp = 5.0f;
  o.kl_coef = 0.05f;
  for (size_t t = 0; t < o.old_logp.size(); t += 3) {
    o.old_logp[t] += (t % 2 ? 30.0f : -30.0f);
    o.ref_logp[t] -= 25.0f;
  }
  ExpectConforms(problem, SpecWith(o));
}

// Every option an objective combines with: softcap, temperature, bias,
// grad_scale, the entropy bonus, 16-bit inputs, small chunks, odd shapes.
TEST_P(PolicyConformanceTest, WithEveryOptionItCombinesWith) {
  ProblemSpec ps;
  ps.vocab_size = 1009;
  ps.hidden_size = 67;
  ps.num_tokens = 37;
  ps.has_bias = true;
  ps.head_dtype = DType::kBF16;
  ps.hidden_dtype = DType::kBF16;
  Problem problem = MakeProblem(ps);
  PolicyObjective o = PolicyFor(problem);
  o.dual_clip = 3.0f;
  o.kl_coef = 0.02f;
  ComputeSpec spec = SpecWith(o);
  spec.options.softcap = 3.0f;
  spec.options.temperature = 0.7f;
  spec.options.grad_scale = 0.5f;
  spec.entropy_weights.assign(ps.num_tokens, -0.01f);
  spec.chunk_tokens = 8;
  ExpectConforms(problem, spec);
}

// Tokens that do not count (masked: weight 0) may carry anything, NaN
// included: they weigh nothing and are not read.
TEST_P(PolicyConformanceTest, MaskedTokensAreNotRead) {
  Problem problem = MakeProblem(ProblemSpec{});
  PolicyObjective o = PolicyFor(problem);
  o.kl_coef = 0.1f;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (size_t t = 0; t < o.weights.size(); t += 4) {
    o.weights[t] = 0.0;
    o.old_logp[t] = nan;
    o.advantages[t] = nan;
    o.ref_logp[t] = nan;
  }
  ExpectConforms(problem, SpecWith(o));
}

TEST_P(PolicyConformanceTest, SequenceMeanAggregations) {
  Problem problem = MakeProblem(ProblemSpec{});
  const int64_t n = problem.spec.num_tokens;
  std::vector<int32_t> sequences(n);
  std::vector<uint8_t> counts(n);
  for (int64_t t = 0; t < n; ++t) {
    sequences[t] = static_cast<int32_t>(t / 7);  // runs of 7 tokens
    counts[t] = problem.targets[t] != problem.spec.ignore_index;
  }
  for (LossAggregation aggregation :
       {LossAggregation::kSeqMeanTokenSum, LossAggregation::kSeqMeanTokenMean}) {
    SCOPED_TRACE(LossAggregationName(aggregation));
    PolicyObjective o = PolicyFor(problem);
    o.weights = *PolicyTokenWeights(aggregation, counts, sequences, 0.0);
    ExpectConforms(problem, SpecWith(o));
  }
}

TEST_P(PolicyConformanceTest, ForwardOnlyGivesTheLossAndStatistics) {
  Problem problem = MakeProblem(ProblemSpec{});
  ComputeSpec spec = SpecWith(PolicyFor(problem));
  spec.outputs.grad_input = false;
  HarnessOptions no_grad;
  no_grad.with_grad_buffer = false;
  ExpectConforms(problem, spec, no_grad);
}

TEST_P(PolicyConformanceTest, OptionsThatDoNotCombineAreRefused) {
  Problem problem = MakeProblem(ProblemSpec{});
  ComputeSpec spec = SpecWith(PolicyFor(problem));
  spec.options.label_smoothing = 0.1f;
  absl::StatusOr<EngineRun> run = RunProblem(*engine_, problem, spec, {});
  ASSERT_FALSE(run.ok());
  EXPECT_EQ(run.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(run.status().message().find("label_smoothing"), std::string::npos) << run.status();
  spec = SpecWith(PolicyFor(problem));
  spec.options.z_loss_scale = 1e-3f;
  run = RunProblem(*engine_, problem, spec, {});
  ASSERT_FALSE(run.ok());
  EXPECT_NE(run.status().message().find("options.z_loss_scale = 0.001 must be off"),
            std::string::npos)
      << run.status();

  spec = SpecWith(PolicyFor(problem));
  spec.token_weights.assign(problem.spec.num_tokens, 1.0f);
  run = RunProblem(*engine_, problem, spec, {});
  ASSERT_FALSE(run.ok());
  EXPECT_NE(run.status().message().find("token_weights"), std::string::npos) << run.status();

  PolicyObjective o = PolicyFor(problem);
  o.advantages[5] = std::numeric_limits<float>::infinity();
  o.weights[5] = 0.5;
  run = RunProblem(*engine_, problem, SpecWith(o), {});
  ASSERT_FALSE(run.ok());
  EXPECT_NE(run.status().message().find("advantages[5]"), std::string::npos) << run.status();
}

INSTANTIATE_TEST_SUITE_P(AllEngines, PolicyConformanceTest,
                         ::testing::ValuesIn(AllEngineParams()), TestParamName);

// An engine without policy objectives says so rather than computing the
// cross-entropy.
class PolicyRefusalTest : public EngineTest {};

TEST_P(PolicyRefusalTest, EnginesWithoutObjectivesRefuse) {
  if (engine_->info().policy_objectives) {
    GTEST_SKIP() << "the " << engine_->info().name << " engine computes policy objectives";
  }
  Problem problem = MakeProblem(ProblemSpec{});
  ComputeSpec spec = BaseSpec();
  PolicyObjective o;
  const int64_t n = problem.spec.num_tokens;
  o.old_logp.assign(n, -1.0f);
  o.advantages.assign(n, 1.0f);
  o.weights.assign(n, 1.0 / static_cast<double>(n));
  spec.policy = o;
  absl::StatusOr<EngineRun> run = RunProblem(*engine_, problem, spec, {});
  ASSERT_FALSE(run.ok());
  EXPECT_EQ(run.status().code(), absl::StatusCode::kFailedPrecondition) << run.status();
  EXPECT_NE(run.status().message().find("policy objectives"), std::string::npos)
      << run.status();
}

INSTANTIATE_TEST_SUITE_P(AllEngines, PolicyRefusalTest, ::testing::ValuesIn(AllEngineParams()),
                         TestParamName);

}  // namespace
}  // namespace flce::test
