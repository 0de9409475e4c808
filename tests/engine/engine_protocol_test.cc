// The engine API's protocol on every engine and strategy: chunking and
// arrival order do not change results, gradients accumulate, GradBuffer's
// operations, concurrent calls, and bad input rejected with the right code.
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <thread>

#include "core/dtype.h"
#include "tests/engine/engine_test_fixture.h"

namespace flce::test {
namespace {

using EngineProtocolTest = EngineTest;

TEST_P(EngineProtocolTest, ChunkSizeDoesNotChangeResults) {
  ProblemSpec ps;
  ps.num_tokens = 29;
  ps.has_bias = true;
  Problem problem = MakeProblem(ps);
  for (int64_t chunk : {int64_t{1}, int64_t{7}, ps.num_tokens, int64_t{0}}) {
    SCOPED_TRACE(::testing::Message() << "chunk_tokens " << chunk);
    ComputeSpec spec = BaseSpec();
    spec.chunk_tokens = chunk;
    ExpectConforms(problem, spec);
  }
}

TEST_P(EngineProtocolTest, ArrivalOrderAndBlockSizeDoNotChangeResults) {
  ProblemSpec ps;
  ps.num_tokens = 40;
  Problem problem = MakeProblem(ps);
  for (int64_t block : {int64_t{1}, int64_t{3}, int64_t{16}, int64_t{0}}) {
    for (bool shuffle : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "block " << block << " shuffled " << shuffle);
      HarnessOptions options;
      options.rows_per_block = block;
      options.shuffle_blocks = shuffle;
      ComputeSpec spec = BaseSpec();
      spec.chunk_tokens = 8;  // chunks that gather rows from several blocks
      ExpectConforms(problem, spec, options);
    }
  }
}

TEST_P(EngineProtocolTest, TwoCallsAccumulateIntoOneGradBuffer) {
  ProblemSpec ps;
  ps.has_bias = true;
  Problem first = MakeProblem(ps);
  Problem second = first;  // same head, new hidden and targets
  {
    ProblemSpec other = ps;
    other.seed = FreshSeed();
    Problem fresh = MakeProblem(other);
    second.hidden = fresh.hidden;
    second.hidden_bytes = fresh.hidden_bytes;
    second.targets = fresh.targets;
  }
  absl::StatusOr<std::shared_ptr<const Head>> head = BuildHead(*engine_, first, 2);
  ASSERT_TRUE(head.ok()) << head.status();
  absl::StatusOr<std::unique_ptr<GradBuffer>> grad = engine_->NewGradBuffer(HeadSpecOf(first));
  ASSERT_TRUE(grad.ok()) << grad.status();
  ComputeSpec spec = BaseSpec();
  spec.reduction = Reduction::kSum;
  ComputeSpec second_spec = spec;
  second_spec.options.grad_scale = 0.5f;
  ASSERT_TRUE(RunCall(*engine_, *head, first, spec, grad->get(), {}).ok());
  ASSERT_TRUE(RunCall(*engine_, *head, second, second_spec, grad->get(), {}).ok());

  ReferenceOutput ref1 = ComputeReference(MakeReferenceInput(first, spec));
  ReferenceOutput ref2 = ComputeReference(MakeReferenceInput(second, second_spec));
  std::vector<double> want_w(ref1.grad_weight.size());
  std::vector<double> want_b(ref1.grad_bias.size());
  for (size_t i = 0; i < want_w.size(); ++i) want_w[i] = ref1.grad_weight[i] + ref2.grad_weight[i];
  for (size_t i = 0; i < want_b.size(); ++i) want_b[i] = ref1.grad_bias[i] + ref2.grad_bias[i];
  absl::StatusOr<std::vector<double>> got_w = ReadGradWeight(**grad, DType::kF32);
  absl::StatusOr<std::vector<double>> got_b = ReadGradBias(**grad, DType::kF32);
  ASSERT_TRUE(got_w.ok() && got_b.ok());
  const Tolerance tol = TolFor(first);
  EXPECT_LE(RelativeError(*got_w, want_w), tol.grad);
  EXPECT_LE(RelativeError(*got_b, want_b), tol.grad);
}

TEST_P(EngineProtocolTest, GradBufferAddScaledZeroAndCopies) {
  ProblemSpec ps;
  ps.has_bias = true;
  ps.vocab_size = 131;
  Problem problem = MakeProblem(ps);
  absl::StatusOr<std::shared_ptr<const Head>> head = BuildHead(*engine_, problem, 1);
  ASSERT_TRUE(head.ok()) << head.status();
  auto source = engine_->NewGradBuffer(HeadSpecOf(problem));
  auto target = engine_->NewGradBuffer(HeadSpecOf(problem));
  ASSERT_TRUE(source.ok() && target.ok());
  EXPECT_EQ((*source)->vocab_size(), ps.vocab_size);
  EXPECT_EQ((*source)->hidden_size(), ps.hidden_size);
  EXPECT_TRUE((*source)->has_bias());
  EXPECT_GE((*source)->bytes(), (ps.vocab_size * ps.hidden_size + ps.vocab_size) * 4);

  // A new buffer is zero.
  auto fresh = ReadGradWeight(**target, DType::kF32);
  ASSERT_TRUE(fresh.ok());
  for (double v : *fresh) ASSERT_EQ(v, 0.0);

  ASSERT_TRUE(RunCall(*engine_, *head, problem, BaseSpec(), source->get(), {}).ok());
  auto w = ReadGradWeight(**source, DType::kF32);
  auto b = ReadGradBias(**source, DType::kF32);
  ASSERT_TRUE(w.ok() && b.ok());

  ASSERT_TRUE((*target)->AddScaled(**source, 2.5f).ok());
  ASSERT_TRUE((*target)->AddScaled(**source, -0.5f).ok());
  auto scaled_w = ReadGradWeight(**target, DType::kF32);
  auto scaled_b = ReadGradBias(**target, DType::kF32);
  ASSERT_TRUE(scaled_w.ok() && scaled_b.ok());
  std::vector<double> want_w(w->size()), want_b(b->size());
  for (size_t i = 0; i < w->size(); ++i) want_w[i] = 2.0 * (*w)[i];
  for (size_t i = 0; i < b->size(); ++i) want_b[i] = 2.0 * (*b)[i];
  EXPECT_LE(RelativeError(*scaled_w, want_w), 1e-6);
  EXPECT_LE(RelativeError(*scaled_b, want_b), 1e-6);

  // bf16 copies are the fp32 values rounded to nearest even.
  auto w16 = ReadGradWeight(**source, DType::kBF16, 13);
  auto b16 = ReadGradBias(**source, DType::kBF16);
  ASSERT_TRUE(w16.ok() && b16.ok());
  for (size_t i = 0; i < w->size(); ++i) {
    ASSERT_EQ((*w16)[i], Bf16ToFloat(FloatToBf16(static_cast<float>((*w)[i])))) << i;
  }
  for (size_t i = 0; i < b->size(); ++i) {
    ASSERT_EQ((*b16)[i], Bf16ToFloat(FloatToBf16(static_cast<float>((*b)[i])))) << i;
  }

  ASSERT_TRUE((*source)->Zero().ok());
  auto zeroed = ReadGradWeight(**source, DType::kF32);
  auto zeroed_b = ReadGradBias(**source, DType::kF32);
  ASSERT_TRUE(zeroed.ok() && zeroed_b.ok());
  for (double v : *zeroed) ASSERT_EQ(v, 0.0);
  for (double v : *zeroed_b) ASSERT_EQ(v, 0.0);
  // The target kept its own copy.
  auto kept = ReadGradWeight(**target, DType::kF32);
  ASSERT_TRUE(kept.ok());
  EXPECT_LE(RelativeError(*kept, want_w), 1e-6);
}

// Landing a contribution: this = base + scale * this, with the finiteness of
// the contribution and of the sum found in the same pass.
TEST_P(EngineProtocolTest, GradBufferScaleAndAddReportsNonFiniteContributionsAndSums) {
  ProblemSpec ps;
  ps.has_bias = true;
  ps.vocab_size = 131;
  Problem problem = MakeProblem(ps);
  absl::StatusOr<std::shared_ptr<const Head>> head = BuildHead(*engine_, problem, 1);
  ASSERT_TRUE(head.ok()) << head.status();
  const HeadSpec spec = HeadSpecOf(problem);
  auto source = engine_->NewGradBuffer(spec);
  ASSERT_TRUE(source.ok());
  ASSERT_TRUE(RunCall(*engine_, *head, problem, BaseSpec(), source->get(), {}).ok());
  auto w = ReadGradWeight(**source, DType::kF32);
  ASSERT_TRUE(w.ok());
  auto copy_of_source = [&]() {
    auto c = engine_->NewGradBuffer(spec);
    EXPECT_TRUE(c.ok() && (*c)->AddScaled(**source, 1.0f).ok());
    return std::move(*c);
  };
  auto base = engine_->NewGradBuffer(spec);
  ASSERT_TRUE(base.ok() && (*base)->AddScaled(**source, -0.25f).ok());

  std::unique_ptr<GradBuffer> sum = copy_of_source();
  absl::StatusOr<FiniteCheck> check = sum->ScaleAndAdd(3.0f, **base);
  ASSERT_TRUE(check.ok()) << check.status();
  EXPECT_TRUE(check->contribution_finite && check->sum_finite);
  auto got = ReadGradWeight(*sum, DType::kF32);
  std::vector<double> want(w->size());
  for (size_t i = 0; i < w->size(); ++i) want[i] = 2.75 * (*w)[i];
  EXPECT_LE(RelativeError(*got, want), 1e-6);
  EXPECT_TRUE(*sum->AllFinite());

  // A contribution that is not finite.
  std::unique_ptr<GradBuffer> inf = copy_of_source();
  check = inf->ScaleAndAdd(std::numeric_limits<float>::infinity(), **base);
  ASSERT_TRUE(check.ok());
  EXPECT_FALSE(check->contribution_finite);
  EXPECT_FALSE(check->sum_finite);
  EXPECT_FALSE(*inf->AllFinite());

  // Finite contributions whose sum overflows: 0.6 x FLT_MAX twice at the largest element.
  // The gradient is first scaled to a largest magnitude of 1, so that the factor
  // itself stays a finite float whatever the gradient's scale.
  auto b = ReadGradBias(**source, DType::kF32);
  ASSERT_TRUE(b.ok());
  double largest = 0.0;
  for (double v : *w) largest = std::max(largest, std::abs(v));
  for (double v : *b) largest = std::max(largest, std::abs(v));
  ASSERT_GT(largest, 0.0);
  auto unit = engine_->NewGradBuffer(spec);
  ASSERT_TRUE(unit.ok() && (*unit)->AddScaled(**source, static_cast<float>(1.0 / largest)).ok());
  const float s = 0.6f * std::numeric_limits<float>::max();
  auto big = engine_->NewGradBuffer(spec);
  ASSERT_TRUE(big.ok() && (*big)->AddScaled(**unit, s).ok());
  EXPECT_TRUE(*(*big)->AllFinite());
  auto over = engine_->NewGradBuffer(spec);
  ASSERT_TRUE(over.ok() && (*over)->AddScaled(**unit, 1.0f).ok());
  check = (*over)->ScaleAndAdd(s, **big);
  ASSERT_TRUE(check.ok());
  EXPECT_TRUE(check->contribution_finite);
  EXPECT_FALSE(check->sum_finite);

  // Other shapes are refused.
  auto other = engine_->NewGradBuffer(HeadSpec{131, ps.hidden_size + 1, DType::kF32, true});
  ASSERT_TRUE(other.ok());
  EXPECT_FALSE(sum->ScaleAndAdd(1.0f, **other).ok());
}

// The finiteness checks read every element, whatever its place: the first,
// one inside, and the last of a weight whose V x H is not a multiple of four
// (the CUDA passes read four at a time and the rest one by one).
TEST_P(EngineProtocolTest, GradBufferChecksFindOneNonFiniteElementAnywhere) {
  const HeadSpec spec{131, 13, DType::kF32, true};
  for (const auto& [row, column] : {std::pair<int32_t, int>{0, 0}, {64, 5}, {130, 12}}) {
    auto grad = engine_->NewGradBuffer(spec);
    auto zero = engine_->NewGradBuffer(spec);
    ASSERT_TRUE(grad.ok() && zero.ok());
    std::vector<float> values(spec.hidden_size, 0.5f);
    values[column] = std::numeric_limits<float>::quiet_NaN();
    ASSERT_TRUE((*grad)->ScatterAddRows(&row, 1, values.data(), DType::kF32, true).ok());
    absl::StatusOr<bool> finite = (*grad)->AllFinite();
    ASSERT_TRUE(finite.ok()) << finite.status();
    EXPECT_FALSE(*finite) << "row " << row << " column " << column;
    absl::StatusOr<FiniteCheck> check = (*grad)->ScaleAndAdd(1.0f, **zero);
    ASSERT_TRUE(check.ok()) << check.status();
    EXPECT_FALSE(check->contribution_finite) << "row " << row << " column " << column;
    EXPECT_FALSE(check->sum_finite) << "row " << row << " column " << column;
  }
}

TEST_P(EngineProtocolTest, GradBufferRejectsBadShapesAndRanges) {
  HeadSpec a{131, 16, DType::kF32, false};
  HeadSpec b{131, 17, DType::kF32, false};
  auto ga = engine_->NewGradBuffer(a);
  auto gb = engine_->NewGradBuffer(b);
  ASSERT_TRUE(ga.ok() && gb.ok());
  EXPECT_EQ((*ga)->AddScaled(**gb, 1.0f).code(), absl::StatusCode::kInvalidArgument);
  std::vector<float> out(131 * 17);
  EXPECT_FALSE((*ga)->CopyWeightRows(130, 2, DType::kF32, out.data()).ok());
  EXPECT_FALSE((*ga)->CopyWeightRows(-1, 1, DType::kF32, out.data()).ok());
  EXPECT_FALSE((*ga)->CopyBias(0, 1, DType::kF32, out.data()).ok());  // no bias
  EXPECT_TRUE((*ga)->CopyWeightRows(129, 2, DType::kF32, out.data()).ok());
}

TEST_P(EngineProtocolTest, RepeatedRunsAreBitwiseIdentical) {
  ProblemSpec ps;
  ps.has_bias = true;
  Problem problem = MakeProblem(ps);
  ComputeSpec spec = BaseSpec();
  spec.deterministic = true;
  HarnessOptions options;
  options.seed = FreshSeed();  // the same block order both times
  auto first = RunProblem(*engine_, problem, spec, options);
  auto second = RunProblem(*engine_, problem, spec, options);
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_EQ(first->result.loss, second->result.loss);
  EXPECT_EQ(first->grad_input, second->grad_input);
  EXPECT_EQ(first->grad_weight, second->grad_weight);
  EXPECT_EQ(first->grad_bias, second->grad_bias);
}

TEST_P(EngineProtocolTest, InterleavedCallsOnOneEngine) {
  ProblemSpec ps;
  ps.num_tokens = 24;
  Problem p1 = MakeProblem(ps);
  Problem p2 = MakeProblem(ps);
  auto h1 = BuildHead(*engine_, p1, 2);
  auto h2 = BuildHead(*engine_, p2, 2);
  ASSERT_TRUE(h1.ok() && h2.ok());
  auto g1 = engine_->NewGradBuffer(HeadSpecOf(p1));
  auto g2 = engine_->NewGradBuffer(HeadSpecOf(p2));
  ASSERT_TRUE(g1.ok() && g2.ok());
  ComputeSpec spec = BaseSpec();
  spec.chunk_tokens = 5;
  auto make_call = [&](const Problem& p, GradBuffer* g, std::shared_ptr<const Head> head,
                       std::vector<float>* grad_in) {
    ComputeSpec s = spec;
    s.num_tokens = p.spec.num_tokens;
    s.hidden_dtype = p.spec.hidden_dtype;
    s.targets = p.targets;
    s.grad_out = g;
    const int64_t H = p.spec.hidden_size;
    grad_in->assign(p.spec.num_tokens * H, std::numeric_limits<float>::quiet_NaN());
    return engine_->StartCompute(
        std::move(head), s, [grad_in, H](int64_t offset, int64_t rows, std::string data) {
          std::memcpy(grad_in->data() + offset * H, data.data(), rows * H * sizeof(float));
        });
  };
  std::vector<float> gi1, gi2;
  auto c1 = make_call(p1, g1->get(), *h1, &gi1);
  auto c2 = make_call(p2, g2->get(), *h2, &gi2);
  ASSERT_TRUE(c1.ok() && c2.ok());
  const int64_t row_bytes = ps.hidden_size * 4;
  for (int64_t t = 0; t < ps.num_tokens; t += 3) {
    ASSERT_TRUE((*c1)->AddHidden(t, 3, p1.hidden_bytes.data() + t * row_bytes).ok());
    ASSERT_TRUE((*c2)->AddHidden(t, 3, p2.hidden_bytes.data() + t * row_bytes).ok());
  }
  auto r2 = (*c2)->Finish();
  auto r1 = (*c1)->Finish();
  ASSERT_TRUE(r1.ok() && r2.ok());
  c1->reset();
  c2->reset();
  const Problem* problems[] = {&p1, &p2};
  const ComputeResult* results[] = {&*r1, &*r2};
  const std::vector<float>* grad_ins[] = {&gi1, &gi2};
  GradBuffer* grads[] = {g1->get(), g2->get()};
  for (int i = 0; i < 2; ++i) {
    ReferenceOutput ref = ComputeReference(MakeReferenceInput(*problems[i], spec));
    EngineRun run;
    run.result = *results[i];
    run.grad_input = ToDoubles(*grad_ins[i]);
    auto w = ReadGradWeight(*grads[i], DType::kF32);
    ASSERT_TRUE(w.ok());
    run.grad_weight = *w;
    ExpectMatchesReference(run, ref, spec, TolFor(*problems[i]));
  }
}

TEST_P(EngineProtocolTest, HeadBuilderChecksItsBytes) {
  HeadSpec spec{37, 8, DType::kBF16, true};
  std::string weight(37 * 8 * 2, '\1');
  std::string bias(37 * 2, '\1');
  auto builder = engine_->BeginHead(spec);
  ASSERT_TRUE(builder.ok()) << builder.status();
  EXPECT_EQ((*builder)->WriteWeight(weight.size() - 2, weight.data(), 4).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE((*builder)->WriteWeight(0, weight.data(), 100).ok());
  ASSERT_TRUE((*builder)->WriteWeight(200, weight.data(), weight.size() - 200).ok());
  ASSERT_TRUE((*builder)->WriteBias(0, bias.data(), bias.size()).ok());
  absl::StatusOr<std::shared_ptr<const Head>> incomplete = (*builder)->Finish();
  EXPECT_EQ(incomplete.status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE((*builder)->WriteWeight(100, weight.data(), 100).ok());
  absl::StatusOr<std::shared_ptr<const Head>> head = (*builder)->Finish();
  ASSERT_TRUE(head.ok()) << head.status();
  EXPECT_EQ((*head)->spec().vocab_size, 37);
  EXPECT_EQ((*head)->spec().hidden_size, 8);
  EXPECT_GT((*head)->resident_bytes(), 0);

  HeadSpec no_bias{37, 8, DType::kF32, false};
  auto plain = engine_->BeginHead(no_bias);
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE((*plain)->WriteBias(0, bias.data(), 4).ok());
  EXPECT_FALSE(engine_->BeginHead(HeadSpec{0, 8, DType::kF32, false}).ok());
}

TEST_P(EngineProtocolTest, EmptyRequest) {
  Problem problem = MakeProblem(ProblemSpec{});
  auto head = BuildHead(*engine_, problem, 1);
  ASSERT_TRUE(head.ok());
  ComputeSpec spec = BaseSpec();
  spec.num_tokens = 0;
  spec.hidden_dtype = DType::kF32;
  auto call = engine_->StartCompute(*head, spec, [](int64_t, int64_t, std::string) {});
  ASSERT_TRUE(call.ok()) << call.status();
  absl::StatusOr<ComputeResult> result = (*call)->Finish();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->loss, 0.0);
  EXPECT_EQ(result->n_valid, 0);
}

TEST_P(EngineProtocolTest, ConcurrentCallsFromTwoThreads) {
  ProblemSpec ps;
  ps.num_tokens = 64;
  ps.has_bias = true;
  Problem problems[2] = {MakeProblem(ps), MakeProblem(ps)};
  ComputeSpec spec = BaseSpec();
  spec.chunk_tokens = 16;
  absl::StatusOr<EngineRun> runs[2];
  std::thread threads[2];
  for (int i = 0; i < 2; ++i) {
    threads[i] = std::thread([&, i] {
      HarnessOptions options;
      options.rows_per_block = 4;
      runs[i] = RunProblem(*engine_, problems[i], spec, options);
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(runs[i].ok()) << runs[i].status();
    ReferenceOutput ref = ComputeReference(MakeReferenceInput(problems[i], spec));
    ExpectMatchesReference(*runs[i], ref, spec, TolFor(problems[i]));
  }
}

TEST_P(EngineProtocolTest, DroppingACallBeforeFinishLeavesTheEngineUsable) {
  Problem problem = MakeProblem(ProblemSpec{});
  auto head = BuildHead(*engine_, problem, 1);
  auto grad = engine_->NewGradBuffer(HeadSpecOf(problem));
  ASSERT_TRUE(head.ok() && grad.ok());
  {
    ComputeSpec spec = BaseSpec();
    spec.num_tokens = problem.spec.num_tokens;
    spec.hidden_dtype = problem.spec.hidden_dtype;
    spec.targets = problem.targets;
    spec.grad_out = grad->get();
    spec.chunk_tokens = 4;
    auto call = engine_->StartCompute(*head, spec, [](int64_t, int64_t, std::string) {});
    ASSERT_TRUE(call.ok());
    ASSERT_TRUE((*call)->AddHidden(0, 10, problem.hidden_bytes.data()).ok());
  }  // cancelled: grad's content is unspecified now
  ASSERT_TRUE((*grad)->Zero().ok());
  ExpectConforms(problem, BaseSpec());
}

// ---- bad input ----

class BadInputTest : public EngineTest {
 protected:
  void SetUp() override {
    EngineTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    problem_ = MakeProblem(ProblemSpec{});
    auto head = BuildHead(*engine_, problem_, 1);
    ASSERT_TRUE(head.ok()) << head.status();
    head_ = *head;
  }
  ComputeSpec ValidSpec() {
    ComputeSpec spec = BaseSpec();
    spec.num_tokens = problem_.spec.num_tokens;
    spec.hidden_dtype = problem_.spec.hidden_dtype;
    spec.targets = problem_.targets;
    return spec;
  }
  absl::Status Start(const ComputeSpec& spec) {
    return engine_->StartCompute(head_, spec, [](int64_t, int64_t, std::string) {}).status();
  }
  std::unique_ptr<ComputeCall> StartValid() {
    auto call = engine_->StartCompute(head_, ValidSpec(), [](int64_t, int64_t, std::string) {});
    EXPECT_TRUE(call.ok()) << call.status();
    return call.ok() ? std::move(*call) : nullptr;
  }
  const char* Rows(int64_t t) {
    return problem_.hidden_bytes.data() + t * problem_.spec.hidden_size * 4;
  }

  Problem problem_;
  std::shared_ptr<const Head> head_;
};

TEST_P(BadInputTest, TargetAtOrAboveVocabulary) {
  ComputeSpec spec = ValidSpec();
  spec.targets[7] = static_cast<int32_t>(problem_.spec.vocab_size);
  absl::Status status = Start(spec);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(status.message().find("7"), std::string::npos) << status;
}

TEST_P(BadInputTest, NegativeTarget) {
  ComputeSpec spec = ValidSpec();
  spec.targets[3] = -5;
  absl::Status status = Start(spec);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(status.message().find("-5"), std::string::npos) << status;
}

TEST_P(BadInputTest, CustomIgnoreIndexIsAccepted) {
  ComputeSpec spec = ValidSpec();
  spec.ignore_index = -1;
  for (int32_t& y : spec.targets) y = y == -100 ? -1 : y;
  EXPECT_TRUE(Start(spec).ok());
  spec.targets[0] = -100;  // no longer the ignore index
  EXPECT_EQ(Start(spec).code(), absl::StatusCode::kInvalidArgument);
}

TEST_P(BadInputTest, WrongSizes) {
  ComputeSpec spec = ValidSpec();
  spec.targets.pop_back();
  EXPECT_EQ(Start(spec).code(), absl::StatusCode::kInvalidArgument);
  spec = ValidSpec();
  spec.token_weights.assign(spec.num_tokens + 1, 1.0f);
  EXPECT_EQ(Start(spec).code(), absl::StatusCode::kInvalidArgument);
  spec = ValidSpec();
  spec.entropy_weights.assign(spec.num_tokens - 1, 1.0f);
  EXPECT_EQ(Start(spec).code(), absl::StatusCode::kInvalidArgument);
  spec = ValidSpec();
  auto wrong = engine_->NewGradBuffer(HeadSpec{problem_.spec.vocab_size + 1,
                                               problem_.spec.hidden_size, DType::kF32, false});
  ASSERT_TRUE(wrong.ok());
  spec.grad_out = wrong->get();
  EXPECT_EQ(Start(spec).code(), absl::StatusCode::kInvalidArgument);
}

TEST_P(BadInputTest, OptionsOutOfRange) {
  const std::vector<std::pair<const char*, LossOptions>> cases = {
      {"label_smoothing > 1", {1.5f, 0, 0, 1, 1}},
      {"label_smoothing < 0", {-0.1f, 0, 0, 1, 1}},
      {"z_loss_scale < 0", {0, -1.0f, 0, 1, 1}},
      {"softcap < 0", {0, 0, -1.0f, 1, 1}},
      {"temperature 0", {0, 0, 0, 0.0f, 1}},
      {"temperature < 0", {0, 0, 0, -1.0f, 1}},
      {"temperature NaN", {0, 0, 0, std::numeric_limits<float>::quiet_NaN(), 1}},
  };
  for (const auto& [name, options] : cases) {
    ComputeSpec spec = ValidSpec();
    spec.options = options;
    EXPECT_EQ(Start(spec).code(), absl::StatusCode::kInvalidArgument) << name;
  }
}

TEST_P(BadInputTest, OverlappingRows) {
  auto call = StartValid();
  ASSERT_NE(call, nullptr);
  ASSERT_TRUE(call->AddHidden(0, 10, Rows(0)).ok());
  absl::Status status = call->AddHidden(8, 4, Rows(8));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(status.message().find("8"), std::string::npos) << status;
  // The call is still usable: the rejected block left no trace.
  ASSERT_TRUE(call->AddHidden(10, problem_.spec.num_tokens - 10, Rows(10)).ok());
  EXPECT_TRUE(call->Finish().ok());
}

TEST_P(BadInputTest, RowsOutOfRange) {
  auto call = StartValid();
  ASSERT_NE(call, nullptr);
  const int64_t BT = problem_.spec.num_tokens;
  EXPECT_EQ(call->AddHidden(BT - 2, 3, Rows(0)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(call->AddHidden(-1, 2, Rows(0)).code(), absl::StatusCode::kInvalidArgument);
}

TEST_P(BadInputTest, MissingRows) {
  auto call = StartValid();
  ASSERT_NE(call, nullptr);
  ASSERT_TRUE(call->AddHidden(0, 5, Rows(0)).ok());
  ASSERT_TRUE(call->AddHidden(6, problem_.spec.num_tokens - 6, Rows(6)).ok());
  absl::StatusOr<ComputeResult> result = call->Finish();
  EXPECT_EQ(result.status().code(), absl::StatusCode::kFailedPrecondition) << result.status();
  EXPECT_NE(result.status().message().find("5"), std::string::npos) << result.status();
}

TEST_P(BadInputTest, NonFiniteHidden) {
  auto call = StartValid();
  ASSERT_NE(call, nullptr);
  std::string rows(Rows(0), 4 * problem_.spec.hidden_size * 4);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(&rows[(2 * problem_.spec.hidden_size + 3) * 4], &nan, 4);
  absl::Status status = call->AddHidden(4, 4, rows.data());
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(status.message().find("6"), std::string::npos) << status;
}

// Rows the caller has checked (ComputeSpec::hidden_checked: the server scans
// each as it arrives) are not scanned a second time: the engine takes them.
TEST_P(BadInputTest, RowsTheCallerCheckedAreNotScannedAgain) {
  ComputeSpec spec = ValidSpec();
  spec.hidden_checked = true;
  auto call = engine_->StartCompute(head_, spec, [](int64_t, int64_t, std::string) {});
  ASSERT_TRUE(call.ok()) << call.status();
  std::string rows(Rows(0), 4 * problem_.spec.hidden_size * 4);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(&rows[(2 * problem_.spec.hidden_size + 3) * 4], &nan, 4);
  EXPECT_TRUE((*call)->AddHidden(4, 4, rows.data()).ok());
}

INSTANTIATE_TEST_SUITE_P(AllEngines, EngineProtocolTest, ::testing::ValuesIn(AllEngineParams()),
                         TestParamName);
INSTANTIATE_TEST_SUITE_P(AllEngines, BadInputTest, ::testing::ValuesIn(AllEngineParams()),
                         TestParamName);

}  // namespace
}  // namespace flce::test
