// core/preference_objective's arithmetic on hand-made pairs.
#include "core/preference_objective.h"

#include <cmath>

#include "gtest/gtest.h"

namespace flce {
namespace {

// One pair: tokens 0-1 chosen, 2-4 rejected.
PreferenceObjective OnePair(PreferenceLoss loss) {
  PreferenceObjective o;
  o.loss = loss;
  o.num_pairs = 1;
  o.sequence_of_token = {0, 0, 1, 1, 1};
  if (PreferenceNeedsReference(loss)) o.ref_logp = {-3.0, -4.0};
  return o;
}

const std::vector<uint8_t> kAll(5, 1);

TEST(PreferenceObjectiveTest, DpoWeighsEveryTokenOfAResponseAlike) {
  PreferenceObjective o = OnePair(PreferenceLoss::kDpoSigmoid);
  o.beta = 0.5f;
  const std::vector<float> logp = {-1.0f, -1.5f, -1.0f, -1.0f, -1.0f};  // S_c = -2.5, S_r = -3
  const PreferenceEvaluation ev = EvaluatePreference(o, logp, kAll);
  const double h = (-2.5 + 3.0) - (-3.0 + 4.0);  // -0.5
  const double sig = 1.0 / (1.0 + std::exp(0.5 * h));  // sigma(-beta h)
  EXPECT_NEAR(ev.loss, std::log1p(std::exp(-0.5 * h)), 1e-12);
  // a_t = -dL/dlogp_t: beta sigma(-beta h) on chosen tokens, the opposite on rejected ones.
  EXPECT_NEAR(ev.token_weights[0], 0.5 * sig, 1e-7);
  EXPECT_NEAR(ev.token_weights[1], 0.5 * sig, 1e-7);
  EXPECT_NEAR(ev.token_weights[3], -0.5 * sig, 1e-7);
  EXPECT_EQ(ev.stats.reward_accurate, 0);  // 0.5 (-2.5 + 3) < 0.5 (-3 + 4)
}

TEST(PreferenceObjectiveTest, HingeCarriesNoGradientOnceTheMarginIsMet) {
  PreferenceObjective o = OnePair(PreferenceLoss::kDpoHinge);
  o.beta = 1.0f;
  const std::vector<float> wide = {-0.1f, -0.1f, -3.0f, -3.0f, -3.0f};  // h = 2.8 + 1 - 1 > 1
  const PreferenceEvaluation ev = EvaluatePreference(o, wide, kAll);
  EXPECT_EQ(ev.loss, 0.0);
  for (float a : ev.token_weights) EXPECT_EQ(a, 0.0f);
}

TEST(PreferenceObjectiveTest, OrpoStaysFiniteWhenEveryTokenIsCertain) {
  PreferenceObjective o = OnePair(PreferenceLoss::kOrpo);
  const std::vector<float> certain = {0.0f, 0.0f, -1.0f, -2.0f, -1.0f};
  const PreferenceEvaluation ev = EvaluatePreference(o, certain, kAll);
  EXPECT_TRUE(std::isfinite(ev.loss));
  for (float a : ev.token_weights) EXPECT_TRUE(std::isfinite(a));
  // The chosen NLL's part (1 / 2 per chosen token) remains; the clamp passes none.
  EXPECT_NEAR(ev.token_weights[0], 0.5, 1e-7);
}

TEST(PreferenceObjectiveTest, NormalizerDividesInsteadOfThePairs) {
  PreferenceObjective o = OnePair(PreferenceLoss::kSimPo);
  const std::vector<float> logp = {-1.0f, -2.0f, -1.0f, -1.0f, -4.0f};
  const PreferenceEvaluation own = EvaluatePreference(o, logp, kAll);
  o.normalizer = 4.0;
  const PreferenceEvaluation quarter = EvaluatePreference(o, logp, kAll);
  EXPECT_NEAR(quarter.loss, own.loss / 4.0, 1e-12);
  EXPECT_NEAR(quarter.token_weights[4], own.token_weights[4] / 4.0f, 1e-7);
}

TEST(PreferenceObjectiveTest, TokensThatDoNotCountAreNotRead) {
  PreferenceObjective o = OnePair(PreferenceLoss::kSimPo);
  std::vector<uint8_t> counts = kAll;
  counts[4] = 0;
  const std::vector<float> logp = {-1.0f, -2.0f, -1.0f, -1.0f, NAN};
  const PreferenceEvaluation ev = EvaluatePreference(o, logp, counts);
  EXPECT_TRUE(std::isfinite(ev.loss));
  EXPECT_EQ(ev.token_weights[4], 0.0f);
  EXPECT_TRUE(ValidatePreferenceObjective(o, counts).ok());
  counts[2] = counts[3] = 0;
  EXPECT_NE(ValidatePreferenceObjective(o, counts).message().find("sequence 1"),
            std::string::npos);
}

}  // namespace
}  // namespace flce
