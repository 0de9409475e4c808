// MATH.md's preference objectives on every engine (two passes through
// StartComputeCall), against the float64 reference (which derives its
// gradients by central differences, sharing no calculus with the engines).
#include <cmath>
#include <random>

#include "tests/engine/engine_test_fixture.h"

namespace flce::test {
namespace {

class PreferenceConformanceTest : public EngineTest {
 protected:
  // `pairs` pairs over the problem's tokens: per pair a two-token prompt
  // (-1), the chosen response, another prompt, the rejected one, of uneven
  // lengths; tokens past the last pair belong to no response. Every response
  // gets a counted target. Reference log-probs near the current ones, so
  // that the margins are moderate.
  PreferenceObjective ObjectiveFor(Problem& problem, PreferenceLoss loss, int32_t pairs = 3) {
    const int64_t n = problem.spec.num_tokens;
    PreferenceObjective o;
    o.loss = loss;
    o.num_pairs = pairs;
    o.sequence_of_token.assign(n, -1);
    const int64_t per_pair = n / pairs;
    for (int32_t p = 0; p < pairs; ++p) {
      const int64_t base = p * per_pair;
      const int64_t chosen = (per_pair - 4) / 2 + (p % 2 == 0 ? 1 : -1);
      for (int64_t t = base + 2; t < base + 2 + chosen; ++t) o.sequence_of_token[t] = 2 * p;
      for (int64_t t = base + 4 + chosen; t < base + per_pair; ++t) o.sequence_of_token[t] = 2 * p + 1;
    }
    for (int64_t s = 0; s < 2 * pairs; ++s) {
      for (int64_t t = 0; t < n; ++t) {
        if (o.sequence_of_token[t] == s) {
          if (problem.targets[t] == problem.spec.ignore_index) problem.targets[t] = 1;
          break;
        }
      }
    }
    if (PreferenceNeedsReference(loss)) {
      ComputeSpec plain = BaseSpec();
      const ReferenceOutput ref = ComputeReference(MakeReferenceInput(problem, plain));
      std::mt19937_64 rng(problem.seed + 29);
      std::normal_distribution<double> noise(0.0, 1.0);
      o.ref_logp.assign(2 * pairs, 0.0);
      for (int64_t t = 0; t < n; ++t) {
        const int32_t s = o.sequence_of_token[t];
        if (s >= 0 && problem.targets[t] != problem.spec.ignore_index) o.ref_logp[s] += ref.logprob[t];
      }
      for (double& r : o.ref_logp) r += noise(rng);
    }
    return o;
  }

  ComputeSpec SpecWith(PreferenceObjective objective) const {
    ComputeSpec spec = BaseSpec();
    spec.outputs.per_token_loss = false;  // a pair's loss has no per-token form
    spec.preference = std::move(objective);
    return spec;
  }

  void ExpectStats(const Problem& problem, const ComputeSpec& spec) {
    absl::StatusOr<EngineRun> run = RunProblem(*engine_, problem, spec, {});
    ASSERT_TRUE(run.ok()) << run.status();
    const ReferenceOutput ref = ComputeReference(MakeReferenceInput(problem, spec));
    const PreferenceStats& got = run->result.preference;
    const double tol = TolFor(problem).loss;
    EXPECT_EQ(got.pairs, spec.preference->num_pairs);
    EXPECT_NEAR(got.pair_loss, ref.preference.pair_loss, tol * (1.0 + std::abs(ref.preference.pair_loss)));
    EXPECT_NEAR(got.nll_loss, ref.preference.nll_loss, tol * (1.0 + std::abs(ref.preference.nll_loss)));
    EXPECT_NEAR(got.chosen_reward_sum, ref.preference.chosen_reward_sum,
                tol * (1.0 + std::abs(ref.preference.chosen_reward_sum)));
    EXPECT_NEAR(got.rejected_reward_sum, ref.preference.rejected_reward_sum,
                tol * (1.0 + std::abs(ref.preference.rejected_reward_sum)));
    EXPECT_NEAR(got.reward_accurate, ref.preference.reward_accurate, 1);
    // The log-prob pass is timed and is a part of the call's engine time.
    EXPECT_GT(run->result.preference_first_pass_ms, 0.0);
    EXPECT_LT(run->result.preference_first_pass_ms, run->result.engine_ms);
  }
};

TEST_P(PreferenceConformanceTest, DpoSigmoid) {
  Problem problem = MakeProblem(ProblemSpec{});
  ComputeSpec spec = SpecWith(ObjectiveFor(problem, PreferenceLoss::kDpoSigmoid));
  spec.preference->beta = 0.5f;
  ExpectConforms(problem, spec);
  ExpectStats(problem, spec);
}

TEST_P(PreferenceConformanceTest, ConservativeDpoWithLabelSmoothing) {
  Problem problem = MakeProblem(ProblemSpec{});
  ComputeSpec spec = SpecWith(ObjectiveFor(problem, PreferenceLoss::kDpoSigmoid));
  spec.preference->label_smoothing = 0.1f;
  ExpectConforms(problem, spec);
}

TEST_P(PreferenceConformanceTest, Ipo) {
  Problem problem = MakeProblem(ProblemSpec{});
  ComputeSpec spec = SpecWith(ObjectiveFor(problem, PreferenceLoss::kIpo));
  spec.preference->beta = 0.3f;
  ExpectConforms(problem, spec);
  ExpectStats(problem, spec);
}

TEST_P(PreferenceConformanceTest, DpoHinge) {
  Problem problem = MakeProblem(ProblemSpec{});
  ComputeSpec spec = SpecWith(ObjectiveFor(problem, PreferenceLoss::kDpoHinge));
  spec.preference->beta = 0.2f;  // margins of a few nats: some pairs inside the hinge
  ExpectConforms(problem, spec);
}

TEST_P(PreferenceConformanceTest, SimPo) {
  Problem problem = MakeProblem(ProblemSpec{});
  ComputeSpec spec = SpecWith(ObjectiveFor(problem, PreferenceLoss::kSimPo));
  spec.preference->beta = 2.0f;
  spec.preference->gamma = 0.5f;
  ExpectConforms(problem, spec);
  ExpectStats(problem, spec);
}

TEST_P(PreferenceConformanceTest, Orpo) {
  Problem problem = MakeProblem(ProblemSpec{});
  ComputeSpec spec = SpecWith(ObjectiveFor(problem, PreferenceLoss::kOrpo));
  spec.preference->beta = 0.1f;
  ExpectConforms(problem, spec);
  ExpectStats(problem, spec);
}

TEST_P(PreferenceConformanceTest, NormalizerBf16OddShapeSmallChunks) {
  ProblemSpec ps;
  ps.vocab_size = 301;
  ps.hidden_size = 40;
  ps.num_tokens = 67;
  ps.head_dtype = DType::kBF16;
  ps.hidden_dtype = DType::kBF16;
  ps.has_bias = true;
  Problem problem = MakeProblem(ps);
  ComputeSpec spec = SpecWith(ObjectiveFor(problem, PreferenceLoss::kDpoSigmoid, 4));
  spec.preference->normalizer = 10.0;
  spec.chunk_tokens = 16;
  HarnessOptions options;
  options.rows_per_block = 7;  // rows arrive in pieces, out of step with the chunks
  ExpectConforms(problem, spec, options);
}

TEST_P(PreferenceConformanceTest, BadObjectivesAreNamedAndNothingRuns) {
  Problem problem = MakeProblem(ProblemSpec{});
  struct Case {
    const char* field;
    void (*spoil)(PreferenceObjective&);
  };
  const Case cases[] = {
      {"sequence_of_token[5] = 6", [](PreferenceObjective& o) { o.sequence_of_token[5] = 6; }},
      {"needs ref_logp", [](PreferenceObjective& o) { o.ref_logp.pop_back(); }},
      {"ref_logp[1]", [](PreferenceObjective& o) { o.ref_logp[1] = NAN; }},
      {"beta = 0", [](PreferenceObjective& o) { o.beta = 0.0f; }},
      {"gamma = 1 applies to simpo only", [](PreferenceObjective& o) { o.gamma = 1.0f; }},
      {"sequence 1 (pair 0's rejected) has no token",
       [](PreferenceObjective& o) {
         for (int32_t& s : o.sequence_of_token) s = s == 1 ? -1 : s;
       }},
  };
  for (const Case& c : cases) {
    PreferenceObjective o = ObjectiveFor(problem, PreferenceLoss::kDpoSigmoid);
    c.spoil(o);
    absl::StatusOr<EngineRun> run = RunProblem(*engine_, problem, SpecWith(o), {});
    ASSERT_FALSE(run.ok()) << c.field;
    EXPECT_EQ(run.status().code(), absl::StatusCode::kInvalidArgument) << run.status();
    EXPECT_NE(run.status().message().find(c.field), std::string::npos) << run.status();
  }
  // An engine handed the objective directly (not through StartComputeCall) refuses it.
  ComputeSpec direct = SpecWith(ObjectiveFor(problem, PreferenceLoss::kDpoSigmoid));
  absl::StatusOr<std::shared_ptr<const Head>> head = BuildHead(*engine_, problem, 3);
  ASSERT_TRUE(head.ok()) << head.status();
  absl::StatusOr<std::unique_ptr<ComputeCall>> call =
      engine_->StartCompute(*head, direct, nullptr);
  ASSERT_FALSE(call.ok());
  EXPECT_EQ(call.status().code(), absl::StatusCode::kFailedPrecondition) << call.status();
}

INSTANTIATE_TEST_SUITE_P(AllEngines, PreferenceConformanceTest,
                         ::testing::ValuesIn(AllEngineParams()), TestParamName);

}  // namespace
}  // namespace flce::test
