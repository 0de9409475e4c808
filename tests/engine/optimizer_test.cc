// Every engine's HeadOptimizer against a float64 implementation of
// torch.optim's SGD and AdamW written out here: the master weight, the served
// weight (the master rounded to the head's dtype), skipped steps that change
// nothing, and GradBuffer::SquaredNorms.
#include "kernels/optimizer.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "tests/engine/engine_test_fixture.h"

namespace flce::test {
namespace {

// torch.optim's single-tensor SGD and AdamW, one parameter group, in double.
struct ReferenceGroup {
  std::vector<double> p, m, v, vmax;
  int64_t steps = 0;

  void Step(OptimizerKind kind, const OptimizerGroup& h, double lr, double multiplier,
            const std::vector<double>& grad) {
    if (m.empty()) {
      m.assign(p.size(), 0.0);
      v.assign(p.size(), 0.0);
      vmax.assign(p.size(), 0.0);
    }
    ++steps;
    const double t = static_cast<double>(steps);
    for (size_t i = 0; i < p.size(); ++i) {
      double g = grad[i] * multiplier;
      if (kind == OptimizerKind::kSgd) {
        if (h.weight_decay != 0.0) g += h.weight_decay * p[i];
        if (h.momentum != 0.0) {
          m[i] = steps == 1 ? g : h.momentum * m[i] + (1.0 - h.dampening) * g;
          g = h.nesterov ? g + h.momentum * m[i] : m[i];
        }
        p[i] -= lr * g;
        continue;
      }
      p[i] *= 1.0 - lr * h.weight_decay;
      m[i] = h.beta1 * m[i] + (1.0 - h.beta1) * g;
      v[i] = h.beta2 * v[i] + (1.0 - h.beta2) * g * g;
      vmax[i] = std::max(vmax[i], v[i]);
      const double second = h.amsgrad ? vmax[i] : v[i];
      const double denom = std::sqrt(second) / std::sqrt(1.0 - std::pow(h.beta2, t)) + h.eps;
      p[i] -= lr / (1.0 - std::pow(h.beta1, t)) * m[i] / denom;
    }
  }
};

// `got` (the fp32 master after a step from `before`) against the reference's
// `want`: what exceeds the rounding of storing each element in fp32 (which no
// computation of the step can avoid) must be within `tolerance` of the step's
// change, norm-wise. Norm-wise because fp32 moments legitimately lose digits
// where a new gradient cancels the old momentum in one element.
void ExpectStepMatches(const std::vector<double>& got, const std::vector<double>& before,
                       const std::vector<double>& want, double tolerance, const char* what) {
  ASSERT_EQ(got.size(), want.size());
  double excess_sq = 0.0, change_sq = 0.0, worst = 0.0;
  size_t worst_at = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double excess =
        std::max(0.0, std::abs(got[i] - want[i]) - std::ldexp(std::abs(want[i]), -23));
    excess_sq += excess * excess;
    change_sq += (want[i] - before[i]) * (want[i] - before[i]);
    if (excess > worst) {
      worst = excess;
      worst_at = i;
    }
  }
  EXPECT_LE(std::sqrt(excess_sq), tolerance * std::sqrt(change_sq))
      << what << ": largest excess at element " << worst_at << ": got " << got[worst_at]
      << ", want " << want[worst_at] << " (before " << before[worst_at] << ")";
}

class OptimizerTest : public EngineTest {
 protected:
  // A head built from a fresh problem, with the problem kept for its data.
  void MakeHead(DType dtype, bool has_bias, int64_t vocab = 131, int64_t hidden = 37) {
    ProblemSpec ps;
    ps.vocab_size = vocab;    // 131: not a multiple of the CUDA engine's padding
    ps.hidden_size = hidden;  // 37: odd, the vectorised passes' tails
    ps.num_tokens = 29;
    ps.head_dtype = dtype;
    ps.has_bias = has_bias;
    problem_ = MakeProblem(ps);
    auto head = BuildHead(*engine_, problem_, 3);
    ASSERT_TRUE(head.ok()) << head.status();
    head_ = *head;
  }

  // One compute call's gradient on fresh hidden states, and its values.
  std::unique_ptr<GradBuffer> FreshGradient(std::vector<double>* weight,
                                            std::vector<double>* bias) {
    ProblemSpec ps = problem_.spec;
    ps.seed = FreshSeed();
    Problem data = MakeProblem(ps);
    Problem call = problem_;
    call.hidden = data.hidden;
    call.hidden_bytes = data.hidden_bytes;
    call.targets = data.targets;
    auto grad = engine_->NewGradBuffer(HeadSpecOf(problem_));
    EXPECT_TRUE(grad.ok()) << grad.status();
    ComputeSpec spec = BaseSpec();
    EXPECT_TRUE(RunCall(*engine_, head_, call, spec, grad->get(), {}).ok());
    *weight = *ReadGradWeight(**grad, DType::kF32);
    if (problem_.spec.has_bias) *bias = *ReadGradBias(**grad, DType::kF32);
    return std::move(*grad);
  }

  std::vector<double> ReadMaster(const HeadOptimizer& optimizer, HeadTensor group) {
    const int64_t n = group == HeadTensor::kWeight
                          ? problem_.spec.vocab_size * problem_.spec.hidden_size
                          : problem_.spec.vocab_size;
    std::vector<float> out(n, std::numeric_limits<float>::quiet_NaN());
    absl::Status status = optimizer.ReadState(group, OptimizerTensor::kMaster, 0, n, out.data());
    EXPECT_TRUE(status.ok()) << status;
    return ToDoubles(out);
  }

  // The served weight must be exactly the master rounded to the head's dtype.
  void ExpectServedIsRoundedMaster(const HeadOptimizer& optimizer, HeadTensor group) {
    std::vector<double> master = ReadMaster(optimizer, group);
    const DType dtype = problem_.spec.head_dtype;
    std::string served(master.size() * DTypeSize(dtype), '\xAB');
    ASSERT_TRUE(head_->CopyOut(group, 0, master.size(), served.data()).ok());
    std::vector<float> master_f(master.begin(), master.end());
    std::string want(served.size(), '\0');
    FromFloat(dtype, master_f.data(), want.data(), master_f.size());
    EXPECT_EQ(served, want) << HeadTensorName(group) << " of a " << DTypeName(dtype) << " head";
  }

  // Trains `steps` steps and compares every step's change of the master with
  // the reference's, group by group.
  void ExpectTracksReference(const OptimizerConfig& config, int steps, double tolerance) {
    auto optimizer = engine_->CreateOptimizer(head_, config);
    ASSERT_TRUE(optimizer.ok()) << optimizer.status();
    ReferenceGroup ref_w, ref_b;
    ref_w.p = ReadMaster(**optimizer, HeadTensor::kWeight);
    EXPECT_EQ(ref_w.p, ToDoubles(problem_.weight)) << "the master starts as the head's weight";
    if (problem_.spec.has_bias) ref_b.p = ReadMaster(**optimizer, HeadTensor::kBias);
    for (int step = 0; step < steps; ++step) {
      SCOPED_TRACE(::testing::Message() << "step " << step << " seed " << problem_.seed);
      std::vector<double> gw, gb;
      std::unique_ptr<GradBuffer> grad = FreshGradient(&gw, &gb);
      StepParams params;
      params.lr_weight = 0.05 * (1.0 - 0.1 * step);  // a schedule
      params.lr_bias = 0.02;
      params.grad_multiplier = step % 2 == 0 ? 1.0f : 0.5f;
      std::vector<double> before_w = ReadMaster(**optimizer, HeadTensor::kWeight);
      absl::StatusOr<StepResult> result = (*optimizer)->Step(*grad, params);
      ASSERT_TRUE(result.ok()) << result.status();
      ASSERT_EQ(*result, StepResult::kApplied);
      EXPECT_EQ((*optimizer)->steps(), step + 1);
      // Continue the reference from the engine's master, so each step is
      // compared alone: the change must match, not just the (much larger) weight.
      ref_w.p = before_w;
      ref_w.Step(config.kind, config.weight, params.lr_weight, params.grad_multiplier, gw);
      std::vector<double> got_w = ReadMaster(**optimizer, HeadTensor::kWeight);
      ExpectStepMatches(got_w, before_w, ref_w.p, tolerance, "weight");
      if (problem_.spec.has_bias) {
        std::vector<double> before_b = ref_b.p;
        ref_b.Step(config.kind, config.bias, params.lr_bias, params.grad_multiplier, gb);
        std::vector<double> got_b = ReadMaster(**optimizer, HeadTensor::kBias);
        ExpectStepMatches(got_b, before_b, ref_b.p, tolerance, "bias");
        ref_b.p = got_b;
      }
      ExpectServedIsRoundedMaster(**optimizer, HeadTensor::kWeight);
      if (problem_.spec.has_bias) ExpectServedIsRoundedMaster(**optimizer, HeadTensor::kBias);
    }
  }

  Problem problem_;
  std::shared_ptr<const Head> head_;
};

TEST_P(OptimizerTest, AdamWMatchesTorchSemanticsOnAnFp32Head) {
  MakeHead(DType::kF32, /*has_bias=*/true);
  OptimizerConfig config;
  config.kind = OptimizerKind::kAdamW;
  config.weight = DefaultOptimizerGroup(OptimizerKind::kAdamW);
  config.weight.weight_decay = 0.1;
  config.bias = DefaultOptimizerGroup(OptimizerKind::kAdamW);
  config.bias.weight_decay = 0.0;
  config.bias.beta1 = 0.8;
  ExpectTracksReference(config, 5, 2e-5);
}

TEST_P(OptimizerTest, AdamWWithAmsgradOnAnFp16Head) {
  MakeHead(DType::kF16, /*has_bias=*/true);
  OptimizerConfig config;
  config.kind = OptimizerKind::kAdamW;
  config.weight = DefaultOptimizerGroup(OptimizerKind::kAdamW);
  config.weight.amsgrad = true;
  config.weight.eps = 1e-6;
  config.bias = config.weight;
  ExpectTracksReference(config, 4, 2e-5);
}

TEST_P(OptimizerTest, SgdWithNesterovMomentumOnABf16Head) {
  MakeHead(DType::kBF16, /*has_bias=*/true);
  OptimizerConfig config;
  config.kind = OptimizerKind::kSgd;
  config.weight.momentum = 0.9;
  config.weight.nesterov = true;
  config.weight.weight_decay = 0.01;
  config.bias.momentum = 0.5;
  config.bias.dampening = 0.3;
  ExpectTracksReference(config, 4, 2e-5);
}

// 4.8 M parameters: more than one round of the CUDA passes' grid-stride loop.
TEST_P(OptimizerTest, AHeadLargerThanOneGridOfThreads) {
  if (IsCpu(GetParam())) GTEST_SKIP() << "the grid-stride rounds are the CUDA passes'";
  MakeHead(DType::kBF16, /*has_bias=*/true, 30011, 161);
  OptimizerConfig config;
  config.kind = OptimizerKind::kAdamW;
  config.weight = DefaultOptimizerGroup(OptimizerKind::kAdamW);
  config.bias = config.weight;
  ExpectTracksReference(config, 2, 2e-5);
}

TEST_P(OptimizerTest, PlainSgdKeepsNoStateOnAnFp32HeadWithoutBias) {
  MakeHead(DType::kF32, /*has_bias=*/false);
  OptimizerConfig config;
  config.kind = OptimizerKind::kSgd;
  auto optimizer = engine_->CreateOptimizer(head_, config);
  ASSERT_TRUE(optimizer.ok()) << optimizer.status();
  // An fp32 head's weight is its own master; plain SGD keeps no moments.
  EXPECT_EQ((*optimizer)->state_bytes(), 0);
  float x;
  EXPECT_EQ(
      (*optimizer)->ReadState(HeadTensor::kWeight, OptimizerTensor::kMomentum, 0, 1, &x).code(),
      absl::StatusCode::kNotFound);
  EXPECT_EQ((*optimizer)
                ->ReadState(HeadTensor::kWeight, OptimizerTensor::kMaster, 0,
                            problem_.spec.vocab_size * problem_.spec.hidden_size + 1, &x)
                .code(),
            absl::StatusCode::kOutOfRange);
  ExpectTracksReference(config, 3, 2e-5);
}

TEST_P(OptimizerTest, StateBytesCountMasterAndMoments) {
  MakeHead(DType::kBF16, /*has_bias=*/true);
  OptimizerConfig config;
  config.kind = OptimizerKind::kAdamW;
  auto optimizer = engine_->CreateOptimizer(head_, config);
  ASSERT_TRUE(optimizer.ok()) << optimizer.status();
  const int64_t params = problem_.spec.vocab_size * (problem_.spec.hidden_size + 1);
  EXPECT_EQ((*optimizer)->state_bytes(), params * 3 * 4);  // master, exp_avg, exp_avg_sq
}

// A step that would produce NaN or Inf changes nothing: not the master, not
// the served weight, not the moments, not the step count.
TEST_P(OptimizerTest, SkippedStepsChangeNothing) {
  MakeHead(DType::kF16, /*has_bias=*/true);
  OptimizerConfig config;
  config.kind = OptimizerKind::kAdamW;
  config.weight = DefaultOptimizerGroup(OptimizerKind::kAdamW);
  config.bias = config.weight;
  auto optimizer = engine_->CreateOptimizer(head_, config);
  ASSERT_TRUE(optimizer.ok()) << optimizer.status();
  std::vector<double> gw, gb;
  std::unique_ptr<GradBuffer> grad = FreshGradient(&gw, &gb);
  StepParams params{1e-3, 1e-3, 1.0f};
  ASSERT_EQ(*(*optimizer)->Step(*grad, params), StepResult::kApplied);

  const int64_t n = problem_.spec.vocab_size * problem_.spec.hidden_size;
  auto snapshot = [&]() {
    std::vector<float> all(4 * n);
    EXPECT_TRUE((*optimizer)
                    ->ReadState(HeadTensor::kWeight, OptimizerTensor::kMaster, 0, n, all.data())
                    .ok());
    EXPECT_TRUE(
        (*optimizer)
            ->ReadState(HeadTensor::kWeight, OptimizerTensor::kMomentum, 0, n, all.data() + n)
            .ok());
    EXPECT_TRUE((*optimizer)
                    ->ReadState(HeadTensor::kWeight, OptimizerTensor::kSecondMoment, 0, n,
                                all.data() + 2 * n)
                    .ok());
    std::string served(n * 2, '\0');
    EXPECT_TRUE(head_->CopyOut(HeadTensor::kWeight, 0, n, served.data()).ok());
    std::string bytes(reinterpret_cast<const char*>(all.data()), 3 * n * 4);
    return bytes + served;
  };
  const std::string before = snapshot();

  params.grad_multiplier = std::numeric_limits<float>::infinity();
  EXPECT_EQ(*(*optimizer)->Step(*grad, params), StepResult::kNonFiniteGradient);
  // A finite gradient so large that one fp16 weight would overflow: Adam's
  // step is about lr, so lr = 1e6 moves weights far beyond 65504.
  params = StepParams{1e6, 1e-3, 1.0f};
  EXPECT_EQ(*(*optimizer)->Step(*grad, params), StepResult::kNonFiniteWeight);
  EXPECT_EQ((*optimizer)->steps(), 1);
  EXPECT_TRUE(snapshot() == before) << "a skipped step changed the state";

  // The state is still usable.
  params = StepParams{1e-3, 1e-3, 1.0f};
  EXPECT_EQ(*(*optimizer)->Step(*grad, params), StepResult::kApplied);
  EXPECT_EQ((*optimizer)->steps(), 2);
}

TEST_P(OptimizerTest, BadLearningRatesAreRefused) {
  MakeHead(DType::kF32, /*has_bias=*/true);
  OptimizerConfig config;
  config.kind = OptimizerKind::kSgd;
  auto optimizer = engine_->CreateOptimizer(head_, config);
  ASSERT_TRUE(optimizer.ok());
  std::vector<double> gw, gb;
  std::unique_ptr<GradBuffer> grad = FreshGradient(&gw, &gb);
  for (double lr : {-1.0, std::numeric_limits<double>::quiet_NaN()}) {
    absl::StatusOr<StepResult> r = (*optimizer)->Step(*grad, StepParams{lr, 0.1, 1.0f});
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
    r = (*optimizer)->Step(*grad, StepParams{0.1, lr, 1.0f});
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  }
  EXPECT_EQ((*optimizer)->steps(), 0);
  // A gradient of another shape.
  HeadSpec other = HeadSpecOf(problem_);
  other.vocab_size += 1;
  auto wrong = engine_->NewGradBuffer(other);
  ASSERT_TRUE(wrong.ok());
  EXPECT_EQ((*optimizer)->Step(**wrong, StepParams{0.1, 0.1, 1.0f}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_P(OptimizerTest, SquaredNormsAreFp64AndRepeatable) {
  MakeHead(DType::kBF16, /*has_bias=*/true);
  std::vector<double> gw, gb;
  std::unique_ptr<GradBuffer> grad = FreshGradient(&gw, &gb);
  double want_w = 0.0, want_b = 0.0;
  for (double x : gw) want_w += x * x;
  for (double x : gb) want_b += x * x;
  absl::StatusOr<GradNorms> norms = grad->SquaredNorms();
  ASSERT_TRUE(norms.ok()) << norms.status();
  ASSERT_GT(want_w, 0.0);
  EXPECT_NEAR(norms->weight_sq, want_w, 1e-12 * want_w);
  EXPECT_NEAR(norms->bias_sq, want_b, 1e-12 * want_b + 1e-300);
  absl::StatusOr<GradNorms> again = grad->SquaredNorms();
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(std::memcmp(&*norms, &*again, sizeof(GradNorms)), 0);
}

TEST(OptimizerConfigTest, RefusedWhereTorchRefuses) {
  struct Case {
    OptimizerKind kind;
    void (*set)(OptimizerGroup&);
    const char* message;
  };
  const Case cases[] = {
      {OptimizerKind::kSgd, [](OptimizerGroup& g) { g.momentum = -0.1; },
       "Invalid momentum value: -0.1"},
      {OptimizerKind::kSgd, [](OptimizerGroup& g) { g.weight_decay = -1; },
       "Invalid weight_decay value: -1"},
      {OptimizerKind::kSgd, [](OptimizerGroup& g) { g.nesterov = true; },
       "Nesterov momentum requires a momentum and zero dampening"},
      {OptimizerKind::kSgd,
       [](OptimizerGroup& g) {
         g.nesterov = true;
         g.momentum = 0.9;
         g.dampening = 0.1;
       },
       "Nesterov momentum requires a momentum and zero dampening"},
      {OptimizerKind::kAdamW, [](OptimizerGroup& g) { g.eps = -1e-8; },
       "Invalid epsilon value: -1e-08"},
      {OptimizerKind::kAdamW, [](OptimizerGroup& g) { g.beta1 = 1.0; },
       "Invalid beta parameter at index 0: 1"},
      {OptimizerKind::kAdamW, [](OptimizerGroup& g) { g.beta2 = -0.5; },
       "Invalid beta parameter at index 1: -0.5"},
      {OptimizerKind::kAdamW, [](OptimizerGroup& g) { g.weight_decay = -0.01; },
       "Invalid weight_decay value: -0.01"},
      {OptimizerKind::kAdamW,
       [](OptimizerGroup& g) { g.beta1 = std::numeric_limits<double>::infinity(); },
       "beta1 = inf is not finite"},
  };
  for (const Case& c : cases) {
    OptimizerGroup g = DefaultOptimizerGroup(c.kind);
    c.set(g);
    absl::Status status = ValidateOptimizerGroup(c.kind, g, "weight");
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_EQ(std::string(status.message()), std::string("weight group: ") + c.message);
  }
  // torch accepts these.
  OptimizerGroup sgd = DefaultOptimizerGroup(OptimizerKind::kSgd);
  sgd.momentum = 0.9;
  sgd.nesterov = true;
  EXPECT_TRUE(ValidateOptimizerGroup(OptimizerKind::kSgd, sgd, "weight").ok());
  OptimizerGroup adamw = DefaultOptimizerGroup(OptimizerKind::kAdamW);
  adamw.beta1 = 0.0;
  adamw.eps = 0.0;
  EXPECT_TRUE(ValidateOptimizerGroup(OptimizerKind::kAdamW, adamw, "weight").ok());
  EXPECT_DOUBLE_EQ(adamw.weight_decay, 1e-2);
  EXPECT_DOUBLE_EQ(DefaultOptimizerGroup(OptimizerKind::kSgd).weight_decay, 0.0);
}

// The optimizer does not depend on the strategy: one case per engine.
std::vector<EngineParam> OneParamPerEngine() {
  return {{"cpu", Strategy::kAuto},
          {"cuda", Strategy::kAuto},
          {"cuda_shards2", Strategy::kAuto},
          {"cuda_shards3", Strategy::kAuto}};
}

INSTANTIATE_TEST_SUITE_P(AllEngines, OptimizerTest, ::testing::ValuesIn(OneParamPerEngine()),
                         TestParamName);

}  // namespace
}  // namespace flce::test
