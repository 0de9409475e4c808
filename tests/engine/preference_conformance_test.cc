// MATH.md's preference objectives on every engine (two passes through
// StartComputeCall), against the float64 reference (which derives its
// gradients by central differences, sharing no calculus with the engines).
#include <algorithm>
#include <cmath>
#include <mutex>
#include <random>
#include <vector>

#include "kernels/preference_pipelined_call.h"
#include "tests/engine/engine_test_fixture.h"
#include "tests/support/delegating_engine.h"

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
    // The log-prob pass is timed; after the rows it is a part of the call's
    // engine time (pipelined with their arrival, it overlaps the rest).
    EXPECT_GT(run->result.preference_first_pass_ms, 0.0);
    if (!PipelinedPreferenceCall::Suits(spec)) {
      EXPECT_LT(run->result.preference_first_pass_ms, run->result.engine_ms);
    }
  }

  // Rows over the wire (wire_paced), in shuffled pieces of 7 against
  // segments of 16 tokens: the pipelined call.
  static ComputeSpec OverTheWire(ComputeSpec spec) {
    spec.wire_paced = true;
    spec.chunk_tokens = 16;
    return spec;
  }
  static HarnessOptions ShuffledPieces() {
    HarnessOptions options;
    options.rows_per_block = 7;
    return options;
  }

  // Pair p's chosen response in the first half of the call and its rejected
  // one in the second (TRL's concatenated layout): no pair has all its
  // log-probs before the second half's rows have come.
  PreferenceObjective ConcatenatedObjective(Problem& problem, int32_t pairs) {
    const int64_t n = problem.spec.num_tokens;
    PreferenceObjective o = ObjectiveFor(problem, PreferenceLoss::kDpoSigmoid, pairs);
    const int64_t half = n / 2, per = half / pairs;
    std::fill(o.sequence_of_token.begin(), o.sequence_of_token.end(), -1);
    for (int32_t p = 0; p < pairs; ++p) {
      for (int64_t t = p * per + 1; t < (p + 1) * per; ++t) {
        o.sequence_of_token[t] = 2 * p;
        o.sequence_of_token[half + t] = 2 * p + 1;
      }
      problem.targets[p * per + 1] = 1;
      problem.targets[half + p * per + 1] = 2;
    }
    const ReferenceOutput ref = ComputeReference(MakeReferenceInput(problem, BaseSpec()));
    std::fill(o.ref_logp.begin(), o.ref_logp.end(), 0.0);
    for (int64_t t = 0; t < n; ++t) {
      const int32_t s = o.sequence_of_token[t];
      if (s >= 0 && problem.targets[t] != problem.spec.ignore_index) o.ref_logp[s] += ref.logprob[t] + 0.01 * s;
    }
    return o;
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

// With rows at a network's pace the passes run segment by segment as the
// rows come (kernels/preference_pipelined_call.h): the same losses, gradients
// and statistics, for responses next to each other and far apart.
TEST_P(PreferenceConformanceTest, PipelinedWithTheRowsArrivalConforms) {
  ProblemSpec ps;
  ps.num_tokens = 203;
  for (PreferenceLoss loss : {PreferenceLoss::kDpoSigmoid, PreferenceLoss::kSimPo,
                              PreferenceLoss::kOrpo}) {
    SCOPED_TRACE(PreferenceLossName(loss));
    Problem problem = MakeProblem(ps);
    ComputeSpec spec = OverTheWire(SpecWith(ObjectiveFor(problem, loss, 5)));
    spec.outputs.logprob = true;
    ASSERT_TRUE(PipelinedPreferenceCall::Suits(spec));
    ExpectConforms(problem, spec, ShuffledPieces());
    ExpectStats(problem, spec);
  }
  Problem problem = MakeProblem(ps);
  ComputeSpec concatenated = OverTheWire(SpecWith(ConcatenatedObjective(problem, 4)));
  ExpectConforms(problem, concatenated, ShuffledPieces());
  // Deterministic calls keep the two passes (the blocks would change grad_W's sums).
  concatenated.deterministic = true;
  EXPECT_FALSE(PipelinedPreferenceCall::Suits(concatenated));
}

// The pipelined call checks the rows as the engines do, in the call's own
// token numbers, and a bad row in a later segment fails the whole call.
TEST_P(PreferenceConformanceTest, PipelinedCallNamesBadRowsInTheCallsTokens) {
  ProblemSpec ps;
  ps.num_tokens = 90;
  ps.hidden_dtype = DType::kF32;
  Problem problem = MakeProblem(ps);
  ComputeSpec spec = OverTheWire(SpecWith(ObjectiveFor(problem, PreferenceLoss::kDpoSigmoid)));
  spec.num_tokens = problem.spec.num_tokens;
  spec.hidden_dtype = problem.spec.hidden_dtype;
  spec.targets = problem.targets;
  spec.ignore_index = problem.spec.ignore_index;
  spec.outputs.grad_input = false;
  absl::StatusOr<std::shared_ptr<const Head>> head = BuildHead(*engine_, problem, 3);
  ASSERT_TRUE(head.ok()) << head.status();
  const int64_t h = problem.spec.hidden_size;
  const float* rows = problem.hidden.data();
  auto start = [&]() {
    auto call = StartComputeCall(*engine_, *head, spec, nullptr);
    EXPECT_TRUE(call.ok()) << call.status();
    return call.ok() ? std::move(*call) : nullptr;
  };

  std::unique_ptr<ComputeCall> call = start();
  ASSERT_NE(call, nullptr);
  ASSERT_TRUE(call->AddHidden(0, 40, rows).ok());
  std::vector<float> spoiled(rows + 40 * h, rows + 50 * h);
  spoiled[3 * h + 2] = NAN;  // token 43, a later segment than the first
  absl::Status st = call->AddHidden(40, 10, spoiled.data());
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("hidden row of token 43 has a non-finite value at column 2"),
            std::string::npos)
      << st;
  EXPECT_FALSE(call->Finish().ok());

  call = start();
  ASSERT_NE(call, nullptr);
  ASSERT_TRUE(call->AddHidden(10, 30, rows + 10 * h).ok());
  st = call->AddHidden(35, 10, rows + 35 * h);
  EXPECT_NE(st.message().find("hidden rows [35, 45) overlap rows already given (token 35)"),
            std::string::npos)
      << st;

  call = start();
  ASSERT_NE(call, nullptr);
  ASSERT_TRUE(call->AddHidden(0, 60, rows).ok());
  st = call->AddHidden(61, 29, rows + 61 * h);
  ASSERT_TRUE(st.ok()) << st;
  absl::StatusOr<ComputeResult> unfinished = call->Finish();
  ASSERT_FALSE(unfinished.ok());
  EXPECT_EQ(unfinished.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(unfinished.status().message().find("token 60 of 90 is missing"), std::string::npos)
      << unfinished.status();

  // Dropped before Finish with segments in flight: nothing hangs.
  call = start();
  ASSERT_NE(call, nullptr);
  ASSERT_TRUE(call->AddHidden(0, 50, rows).ok());
  call.reset();
}

// Where the caller leaves the chunk to the engine, the pipelined call cuts
// its segments and gradient blocks in whole chunks of the engine's plan for
// the call (Engine::PlannedChunkTokens), the last block excepted, and each
// segment's first pass runs once its rows are in rather than in a paced
// call's small edge chunks.
TEST_P(PreferenceConformanceTest, PipelinedPiecesAreWholeChunksOfTheEnginesPlan) {
  constexpr int64_t kUnit = 3000;  // segments of 2 units: 8192 / 3000 = 2
  struct Piece {
    int64_t tokens;
    bool gradient;
    bool wire_paced;
  };
  class Recording : public DelegatingEngine {
   public:
    explicit Recording(Engine& inner) : DelegatingEngine(inner) {}
    int64_t PlannedChunkTokens(const Head&, const ComputeSpec& spec) const override {
      planned_for_paced = planned_for_paced || spec.wire_paced;
      return kUnit;
    }
    absl::StatusOr<std::unique_ptr<ComputeCall>> StartCompute(std::shared_ptr<const Head> head,
                                                              ComputeSpec spec,
                                                              GradInputSink sink) override {
      {
        std::lock_guard<std::mutex> lock(mu);
        pieces.push_back({spec.num_tokens, !spec.token_weights.empty(), spec.wire_paced});
      }
      return DelegatingEngine::StartCompute(std::move(head), std::move(spec), std::move(sink));
    }
    mutable bool planned_for_paced = false;  // asked once, at the call's start
    std::mutex mu;  // segments start on the caller's thread, blocks on the call's worker
    std::vector<Piece> pieces;
  };
  ProblemSpec ps;
  ps.num_tokens = 20000;
  ps.vocab_size = 31;
  ps.hidden_size = 8;
  Problem problem = MakeProblem(ps);
  ComputeSpec spec = SpecWith(ObjectiveFor(problem, PreferenceLoss::kDpoSigmoid, 20));
  spec.wire_paced = true;
  ASSERT_TRUE(PipelinedPreferenceCall::Suits(spec));
  HarnessOptions options;
  options.rows_per_block = 997;

  Engine* const engine = engine_;
  Recording recording(*engine);
  engine_ = &recording;
  ExpectConforms(problem, spec, options);
  engine_ = engine;

  EXPECT_FALSE(recording.planned_for_paced) << "the plan asked for is the whole call's, at once";
  std::vector<int64_t> segments, blocks;
  for (const Piece& piece : recording.pieces) {
    (piece.gradient ? blocks : segments).push_back(piece.tokens);
    EXPECT_FALSE(piece.wire_paced) << piece.tokens << " tokens, gradient " << piece.gradient;
  }
  std::sort(segments.begin(), segments.end());  // started in the shuffled rows' order
  EXPECT_EQ(segments, (std::vector<int64_t>{2000, 6000, 6000, 6000}));
  ASSERT_FALSE(blocks.empty());
  int64_t covered = 0;
  for (size_t b = 0; b < blocks.size(); ++b) {
    covered += blocks[b];
    if (b + 1 == blocks.size()) break;
    EXPECT_EQ(blocks[b] % kUnit, 0) << "block " << b << " of " << blocks[b] << " tokens";
    EXPECT_GE(blocks[b], 2 * kUnit) << "block " << b;
  }
  EXPECT_EQ(covered, ps.num_tokens);
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
