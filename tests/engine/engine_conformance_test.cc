// MATH.md, option by option, on every engine and strategy, against the
// float64 reference.
#include <cmath>

#include "tests/engine/engine_test_fixture.h"

namespace flce::test {
namespace {

using EngineConformanceTest = EngineTest;

TEST_P(EngineConformanceTest, MeanReduction) {
  ExpectConforms(ProblemSpec{}, BaseSpec());
}

TEST_P(EngineConformanceTest, SumReduction) {
  ComputeSpec spec = BaseSpec();
  spec.reduction = Reduction::kSum;
  ExpectConforms(ProblemSpec{}, spec);
}

TEST_P(EngineConformanceTest, NoneReductionDefaultsToUnitWeights) {
  ComputeSpec spec = BaseSpec();
  spec.reduction = Reduction::kNone;
  ExpectConforms(ProblemSpec{}, spec);
}

TEST_P(EngineConformanceTest, LabelSmoothing) {
  ComputeSpec spec = BaseSpec();
  spec.options.label_smoothing = 0.1f;
  ExpectConforms(ProblemSpec{}, spec);
  spec.options.label_smoothing = 1.0f;  // the edge of the range
  ExpectConforms(ProblemSpec{}, spec);
}

TEST_P(EngineConformanceTest, ZLoss) {
  ComputeSpec spec = BaseSpec();
  spec.options.z_loss_scale = 1e-2f;
  ExpectConforms(ProblemSpec{}, spec);
}

TEST_P(EngineConformanceTest, Softcap) {
  ComputeSpec spec = BaseSpec();
  spec.options.softcap = 1.5f;  // small enough to bend N(0,1) logits
  ExpectConforms(ProblemSpec{}, spec);
}

TEST_P(EngineConformanceTest, Temperature) {
  ComputeSpec spec = BaseSpec();
  spec.options.temperature = 0.6f;
  ExpectConforms(ProblemSpec{}, spec);
  spec.options.temperature = 2.5f;
  ExpectConforms(ProblemSpec{}, spec);
}

// Without accuracy no argmax is computed (the logits-stats GEMM's epilogue
// skips it): everything else as with it, on 16-bit heads too.
TEST_P(EngineConformanceTest, WithoutAccuracy) {
  ComputeSpec spec = BaseSpec();
  spec.outputs.accuracy = false;
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(DTypeName(dtype));
    ProblemSpec ps;
    ps.vocab_size = 1031;  // five 256-column tiles, the last partial
    ps.head_dtype = dtype;
    ps.hidden_dtype = dtype;
    ExpectConforms(ps, spec);
  }
}

// A training call that asks for the loss and the gradients only: no entropy
// (the CUDA engine's GEMM epilogue then takes its statistics around the row's
// target logit), no accuracy; peaked rows too.
TEST_P(EngineConformanceTest, WithoutEntropyOrAccuracy) {
  ComputeSpec spec = BaseSpec();
  spec.outputs.accuracy = false;
  spec.outputs.entropy = false;
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (double weight_scale : {1.0, 10.0}) {
      SCOPED_TRACE(::testing::Message() << DTypeName(dtype) << ", W x " << weight_scale);
      ProblemSpec ps;
      ps.vocab_size = 1031;  // five 256-column tiles, the last partial
      ps.head_dtype = dtype;
      ps.hidden_dtype = dtype;
      ps.weight_scale = weight_scale;
      ExpectConforms(ps, spec);
    }
  }
}

TEST_P(EngineConformanceTest, GradScale) {
  ComputeSpec spec = BaseSpec();
  spec.options.grad_scale = 0.125f;
  ExpectConforms(ProblemSpec{}, spec);
}

TEST_P(EngineConformanceTest, Bias) {
  ProblemSpec ps;
  ps.has_bias = true;
  ExpectConforms(ps, BaseSpec());
}

TEST_P(EngineConformanceTest, EveryOptionAtOnce) {
  ProblemSpec ps;
  ps.has_bias = true;
  for (Reduction reduction : {Reduction::kMean, Reduction::kSum, Reduction::kNone}) {
    ComputeSpec spec = BaseSpec();
    spec.reduction = reduction;
    spec.options.label_smoothing = 0.05f;
    spec.options.z_loss_scale = 1e-3f;
    spec.options.softcap = 3.0f;
    spec.options.temperature = 0.8f;
    spec.options.grad_scale = 4.0f;
    ExpectConforms(ps, spec);
  }
}

TEST_P(EngineConformanceTest, PeakedPredictions) {
  ProblemSpec ps;
  ps.weight_scale = 10.0;
  ps.targets_at_argmax = true;
  ExpectConforms(ps, BaseSpec());
  ps.targets_at_argmax = false;  // confident and wrong: p_y near 0
  ExpectConforms(ps, BaseSpec());
}

TEST_P(EngineConformanceTest, PeakedWithZLossAndSmoothing) {
  ProblemSpec ps;
  ps.weight_scale = 10.0;
  ps.targets_at_argmax = true;
  ComputeSpec spec = BaseSpec();
  spec.options.label_smoothing = 0.1f;
  spec.options.z_loss_scale = 1e-4f;
  ExpectConforms(ps, spec);
}

TEST_P(EngineConformanceTest, PeakedWithSoftcap) {
  ProblemSpec ps;
  ps.weight_scale = 10.0;
  ps.targets_at_argmax = true;
  ps.has_bias = true;
  ComputeSpec spec = BaseSpec();
  // Confident rows whose logits saturate tanh: the top ones can round to the same fp32
  // value, so the reference excuses the tokens within rounding of a tie (and only those).
  spec.options.softcap = 10.0f;
  ExpectConforms(ps, spec);
}

TEST_P(EngineConformanceTest, PrimeVocabularyOddHidden) {
  ProblemSpec ps;
  ps.vocab_size = 1009;
  ps.hidden_size = 67;
  ps.num_tokens = 37;
  ExpectConforms(ps, BaseSpec());
}

TEST_P(EngineConformanceTest, VocabularyNotAMultipleOfEight) {
  ProblemSpec ps;
  ps.vocab_size = 1003;
  ps.hidden_size = 40;
  ExpectConforms(ps, BaseSpec());
}

TEST_P(EngineConformanceTest, TinyShapes) {
  for (int64_t v : {1, 2, 3}) {
    ProblemSpec ps;
    ps.vocab_size = v;
    ps.hidden_size = 1;
    ps.num_tokens = 3;
    ps.ignore_fraction = 0.0;
    ExpectConforms(ps, BaseSpec());
  }
}

TEST_P(EngineConformanceTest, SingleToken) {
  ProblemSpec ps;
  ps.vocab_size = 1009;
  ps.hidden_size = 67;
  ps.num_tokens = 1;
  ps.ignore_fraction = 0.0;
  ExpectConforms(ps, BaseSpec());
}

TEST_P(EngineConformanceTest, AllTargetsIgnored) {
  ProblemSpec ps;
  ps.ignore_fraction = 1.0;
  for (Reduction reduction : {Reduction::kMean, Reduction::kSum, Reduction::kNone}) {
    ComputeSpec spec = BaseSpec();
    spec.reduction = reduction;
    Problem problem = MakeProblem(ps);
    absl::StatusOr<EngineRun> run = RunProblem(*engine_, problem, spec, {});
    ASSERT_TRUE(run.ok()) << run.status();
    EXPECT_EQ(run->result.loss, 0.0);
    EXPECT_EQ(run->result.z_loss, 0.0);
    EXPECT_EQ(run->result.n_valid, 0);
    EXPECT_EQ(run->result.n_correct, 0);
    EXPECT_TRUE(std::isfinite(run->result.entropy_sum));
    EXPECT_GT(run->result.entropy_sum, 0.0);
    for (double g : run->grad_input) ASSERT_EQ(g, 0.0);
    for (double g : run->grad_weight) ASSERT_EQ(g, 0.0);
    for (float v : run->result.per_token_loss) ASSERT_EQ(v, 0.0f);
    for (float v : run->result.logprob) ASSERT_EQ(v, 0.0f);
    for (uint8_t c : run->result.correct) ASSERT_EQ(c, 0);
  }
}

TEST_P(EngineConformanceTest, AllTargetsIgnoredKeepsEntropyGradient) {
  ProblemSpec ps;
  ps.ignore_fraction = 1.0;
  ps.has_bias = true;
  Problem problem = MakeProblem(ps);
  ComputeSpec spec = BaseSpec();
  spec.entropy_weights = RandomFloats(ps.num_tokens, -0.5f, 1.0f, problem.seed + 1);
  ExpectConforms(problem, spec);
}

TEST_P(EngineConformanceTest, TokenWeightsReplaceTheReduction) {
  ProblemSpec ps;
  ps.ignore_fraction = 0.2;
  for (Reduction reduction : {Reduction::kMean, Reduction::kSum, Reduction::kNone}) {
    Problem problem = MakeProblem(ps);
    ComputeSpec spec = BaseSpec();
    spec.reduction = reduction;
    // Weights on ignored tokens too: they must be dropped.
    spec.token_weights = RandomFloats(ps.num_tokens, -1.0f, 2.0f, problem.seed + 1);
    ExpectConforms(problem, spec);
  }
}

TEST_P(EngineConformanceTest, EntropyWeights) {
  ProblemSpec ps;
  ps.ignore_fraction = 0.2;
  Problem problem = MakeProblem(ps);
  ComputeSpec spec = BaseSpec();
  spec.entropy_weights = RandomFloats(ps.num_tokens, -0.5f, 0.5f, problem.seed + 1);
  ExpectConforms(problem, spec);
}

TEST_P(EngineConformanceTest, RlStyleTokenAndEntropyWeightsWithOptions) {
  ProblemSpec ps;
  ps.has_bias = true;
  Problem problem = MakeProblem(ps);
  ComputeSpec spec = BaseSpec();
  spec.reduction = Reduction::kNone;
  spec.token_weights = RandomFloats(ps.num_tokens, -1.0f, 1.0f, problem.seed + 1);
  spec.entropy_weights = RandomFloats(ps.num_tokens, 0.0f, 0.1f, problem.seed + 2);
  spec.options.temperature = 0.7f;
  spec.options.softcap = 4.0f;
  spec.options.grad_scale = 0.5f;
  ExpectConforms(problem, spec);
}

TEST_P(EngineConformanceTest, HeadAndHiddenDtypes) {
  const DType kDtypes[][2] = {{DType::kBF16, DType::kBF16}, {DType::kF16, DType::kF16},
                              {DType::kBF16, DType::kF32},  {DType::kF32, DType::kBF16},
                              {DType::kF16, DType::kBF16},  {DType::kF32, DType::kF16}};
  for (const auto& dtypes : kDtypes) {
    ProblemSpec ps;
    ps.vocab_size = 509;
    ps.head_dtype = dtypes[0];
    ps.hidden_dtype = dtypes[1];
    ps.has_bias = true;
    SCOPED_TRACE(::testing::Message() << "head " << DTypeName(dtypes[0]) << ", hidden "
                                      << DTypeName(dtypes[1]));
    ExpectConforms(ps, BaseSpec());
  }
}

TEST_P(EngineConformanceTest, PeakedInBf16) {
  ProblemSpec ps;
  ps.head_dtype = DType::kBF16;
  ps.hidden_dtype = DType::kBF16;
  ps.weight_scale = 10.0;
  ps.targets_at_argmax = true;
  ExpectConforms(ps, BaseSpec());
}

TEST_P(EngineConformanceTest, ForwardOnly) {
  Problem problem = MakeProblem(ProblemSpec{});
  ComputeSpec spec = BaseSpec();
  spec.outputs.grad_input = false;
  HarnessOptions options;
  options.with_grad_buffer = false;
  ExpectConforms(problem, spec, options);
}

TEST_P(EngineConformanceTest, GradInputWithoutGradBuffer) {
  Problem problem = MakeProblem(ProblemSpec{});
  HarnessOptions options;
  options.with_grad_buffer = false;
  ExpectConforms(problem, BaseSpec(), options);
}

TEST_P(EngineConformanceTest, GradWeightWithoutGradInput) {
  ProblemSpec ps;
  ps.has_bias = true;
  ComputeSpec spec = BaseSpec();
  spec.outputs.grad_input = false;
  ExpectConforms(ps, spec);
}

TEST_P(EngineConformanceTest, LargerProblem) {
  ProblemSpec ps;
  ps.vocab_size = 4099;
  ps.hidden_size = 96;
  ps.num_tokens = 300;
  ps.has_bias = true;
  ComputeSpec spec = BaseSpec();
  spec.options.z_loss_scale = 1e-4f;
  HarnessOptions options;
  options.rows_per_block = 64;
  ExpectConforms(ps, spec, options);
}

INSTANTIATE_TEST_SUITE_P(AllEngines, EngineConformanceTest,
                         ::testing::ValuesIn(AllEngineParams()), TestParamName);

}  // namespace
}  // namespace flce::test
