// The fixture every engine suite derives from: it obtains the parameter's
// engine (skipping, with the reason, when there is no CUDA device) and runs a
// problem through it against the float64 reference.
#ifndef FLCE_TESTS_ENGINE_ENGINE_TEST_FIXTURE_H_
#define FLCE_TESTS_ENGINE_ENGINE_TEST_FIXTURE_H_

#include "gtest/gtest.h"
#include "kernels/engine.h"
#include "tests/engine/conformance_checks.h"
#include "tests/engine/engine_params.h"
#include "tests/support/engine_harness.h"
#include "tests/support/problem.h"
#include "tests/support/reference_f64.h"

namespace flce::test {

class EngineTest : public ::testing::TestWithParam<EngineParam> {
 protected:
  void SetUp() override;

  // Strategy from the parameter; every per-token output asked for.
  ComputeSpec BaseSpec() const;
  Tolerance TolFor(const Problem& problem) const;

  // Runs `problem` with `spec` and expects it to match the reference.
  void ExpectConforms(const Problem& problem, const ComputeSpec& spec,
                      const HarnessOptions& options = {});
  void ExpectConforms(const ProblemSpec& problem_spec, const ComputeSpec& spec,
                      const HarnessOptions& options = {});

  Engine* engine_ = nullptr;
};

std::string TestParamName(const ::testing::TestParamInfo<EngineParam>& info);

}  // namespace flce::test

#endif  // FLCE_TESTS_ENGINE_ENGINE_TEST_FIXTURE_H_
