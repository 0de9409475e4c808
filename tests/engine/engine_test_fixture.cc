#include "tests/engine/engine_test_fixture.h"

namespace flce::test {

void EngineTest::SetUp() {
  absl::StatusOr<Engine*> engine = SharedEngine(GetParam().engine);
  if (!engine.ok()) {
    if (IsCpu(GetParam())) FAIL() << "CPU engine: " << engine.status();
    GTEST_SKIP() << "no CUDA device: " << engine.status().message();
  }
  engine_ = *engine;
}

ComputeSpec EngineTest::BaseSpec() const { return AllOutputsSpec(GetParam().strategy); }

Tolerance EngineTest::TolFor(const Problem& problem) const {
  return ToleranceFor(GetParam().engine, problem.spec.head_dtype, problem.spec.hidden_dtype,
                      problem.spec.num_tokens);
}

void EngineTest::ExpectConforms(const Problem& problem, const ComputeSpec& spec,
                                const HarnessOptions& options) {
  SCOPED_TRACE(::testing::Message() << "problem seed " << problem.seed << ", V "
                                    << problem.spec.vocab_size << ", H "
                                    << problem.spec.hidden_size << ", BT "
                                    << problem.spec.num_tokens);
  absl::StatusOr<EngineRun> run = RunProblem(*engine_, problem, spec, options);
  ASSERT_TRUE(run.ok()) << run.status();
  ReferenceOutput ref = ComputeReference(MakeReferenceInput(problem, spec));
  ExpectMatchesReference(*run, ref, spec, TolFor(problem));
}

void EngineTest::ExpectConforms(const ProblemSpec& problem_spec, const ComputeSpec& spec,
                                const HarnessOptions& options) {
  ExpectConforms(MakeProblem(problem_spec), spec, options);
}

std::string TestParamName(const ::testing::TestParamInfo<EngineParam>& info) {
  return ParamName(info.param);
}

}  // namespace flce::test
