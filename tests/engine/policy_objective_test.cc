// core/policy_objective.h: the aggregation's weights by hand, and the per-token
// arithmetic where autograd's choices matter (ties, clamps).
#include "core/policy_objective.h"

#include <cmath>

#include "gtest/gtest.h"

namespace flce {
namespace {

TEST(PolicyTokenWeightsTest, TokenMeanDividesByTheCountedTokens) {
  auto w = PolicyTokenWeights(LossAggregation::kTokenMean, {1, 0, 1, 1}, {}, 0.0);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(*w, (std::vector<double>{1.0 / 3, 0.0, 1.0 / 3, 1.0 / 3}));
  // A normaliser given by the caller (the whole batch's count) replaces it.
  w = PolicyTokenWeights(LossAggregation::kTokenMean, {1, 0, 1, 1}, {}, 12.0);
  EXPECT_EQ(*w, (std::vector<double>{1.0 / 12, 0.0, 1.0 / 12, 1.0 / 12}));
}

TEST(PolicyTokenWeightsTest, SequenceMeans) {
  // Sequences 4 (two tokens), 7 (three, one masked), 9 (masked only: not counted).
  const std::vector<uint8_t> counts = {1, 1, 1, 0, 1, 0};
  const std::vector<int32_t> ids = {4, 4, 7, 7, 7, 9};
  auto w = PolicyTokenWeights(LossAggregation::kSeqMeanTokenSum, counts, ids, 0.0);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(*w, (std::vector<double>{0.5, 0.5, 0.5, 0.0, 0.5, 0.0}));
  w = PolicyTokenWeights(LossAggregation::kSeqMeanTokenMean, counts, ids, 0.0);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(*w, (std::vector<double>{0.25, 0.25, 0.25, 0.0, 0.25, 0.0}));
  w = PolicyTokenWeights(LossAggregation::kSeqMeanTokenSum, counts, ids, 8.0);
  EXPECT_EQ(*w, (std::vector<double>{0.125, 0.125, 0.125, 0.0, 0.125, 0.0}));
}

TEST(PolicyTokenWeightsTest, NothingCountsGivesZeros) {
  auto w = PolicyTokenWeights(LossAggregation::kSeqMeanTokenMean, {0, 0}, {1, 2}, 0.0);
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(*w, (std::vector<double>{0.0, 0.0}));
}

TEST(PolicyTokenWeightsTest, BadSequenceIdsAndNormalisersAreNamed) {
  auto w = PolicyTokenWeights(LossAggregation::kTokenMean, {1, 1, 1}, {0, 2, 1}, 0.0);
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().message(),
            "sequence_ids[2] = 1 is below sequence_ids[1] = 2: each sequence is one run of "
            "tokens, in order");
  w = PolicyTokenWeights(LossAggregation::kTokenMean, {1, 1, 1}, {0, 0}, 0.0);
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().message(), "sequence_ids has 2 entries, expected num_tokens = 3");
  w = PolicyTokenWeights(LossAggregation::kTokenMean, {1}, {}, -1.0);
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("normalizer = -1"), std::string::npos);
}

TEST(EvaluatePolicyTokenTest, InsideTheBoundsTheGradientIsMinusARatio) {
  PolicyObjective o;
  const PolicyTokenTerms t = EvaluatePolicyToken(o, -1.0, -1.1, 2.0, 0.0);
  EXPECT_NEAR(t.ratio, std::exp(0.1), 1e-15);
  EXPECT_NEAR(t.loss, -2.0 * std::exp(0.1), 1e-15);
  EXPECT_NEAR(t.dloss_dlogp, -2.0 * std::exp(0.1), 1e-15);
  EXPECT_FALSE(t.clipped_low || t.clipped_high);
}

TEST(EvaluatePolicyTokenTest, ClippedSideCarriesNoGradient) {
  PolicyObjective o;  // 0.2 / 0.2
  // A > 0, r = e^0.5 > 1.2: min(r, 1.2) A is the objective, constant in logp.
  PolicyTokenTerms t = EvaluatePolicyToken(o, 0.0, -0.5, 1.0, 0.0);
  EXPECT_NEAR(t.loss, -1.2, 1e-7);
  EXPECT_EQ(t.dloss_dlogp, 0.0);
  EXPECT_TRUE(t.clipped_high);
  // A < 0, r = e^-0.5 < 0.8: clipped below.
  t = EvaluatePolicyToken(o, 0.0, 0.5, -1.0, 0.0);
  EXPECT_NEAR(t.loss, 0.8, 1e-7);
  EXPECT_EQ(t.dloss_dlogp, 0.0);
  EXPECT_TRUE(t.clipped_low);
  // A > 0, r < 0.8: the unclipped term is the larger (pessimistic): it counts.
  t = EvaluatePolicyToken(o, 0.0, 0.5, 1.0, 0.0);
  EXPECT_NEAR(t.dloss_dlogp, -std::exp(-0.5), 1e-15);
  EXPECT_FALSE(t.clipped_low);
}

// torch.maximum splits the gradient on a tie, torch.clamp passes it at its
// bounds: with zero-width bounds and r = 1 exactly both halves are -A.
TEST(EvaluatePolicyTokenTest, TiesSplitAsAutogradSplitsThem) {
  PolicyObjective o;
  o.clip_low = 0.0f;
  o.clip_high = 0.0f;
  PolicyTokenTerms t = EvaluatePolicyToken(o, -2.0, -2.0, 3.0, 0.0);
  EXPECT_EQ(t.dloss_dlogp, -3.0);
  // Dual clip at a tie: min(-c A, L) gives L half of its gradient.
  o.clip_low = 0.2f;
  o.clip_high = 0.2f;
  o.dual_clip = 4.0f;
  t = EvaluatePolicyToken(o, std::log(4.0), 0.0, -1.0, 0.0);  // -A r = 4 = -c A, up to rounding
  if (t.ratio == 4.0) {
    EXPECT_EQ(t.dloss_dlogp, 0.5 * 4.0);
  } else {
    EXPECT_EQ(t.dloss_dlogp, t.ratio < 4.0 ? t.ratio : 0.0);
  }
}

TEST(EvaluatePolicyTokenTest, DualClipBoundsNegativeAdvantages) {
  PolicyObjective o;
  o.dual_clip = 3.0f;
  const PolicyTokenTerms t = EvaluatePolicyToken(o, 0.0, -2.0, -1.0, 0.0);  // r = e^2 > 3
  EXPECT_NEAR(t.loss, 3.0, 1e-12);
  EXPECT_EQ(t.dloss_dlogp, 0.0);
  EXPECT_TRUE(t.dual_clipped);
}

TEST(EvaluatePolicyTokenTest, LogRatioClampStopsTheGradient) {
  PolicyObjective o;
  o.clip_high = 10.0f;
  const PolicyTokenTerms t = EvaluatePolicyToken(o, 0.0, -25.0, -1.0, 0.0);
  EXPECT_NEAR(t.ratio, std::exp(20.0), 1e-3);
  EXPECT_EQ(t.dloss_dlogp, 0.0);
  EXPECT_EQ(t.log_ratio, 20.0);  // clamped, as verl's ppo_kl reads it
}

TEST(EvaluatePolicyTokenTest, CispoWeighsLogpByTheDetachedClippedRatio) {
  PolicyObjective o;
  o.loss = PolicyLoss::kCispo;
  o.clip_low = 1.0f;
  o.clip_high = 0.28f;
  const PolicyTokenTerms t = EvaluatePolicyToken(o, -0.5, -1.5, 2.0, 0.0);  // r = e > 1.28
  EXPECT_NEAR(t.loss, -2.0 * 1.28 * -0.5, 1e-7);
  EXPECT_NEAR(t.dloss_dlogp, -2.0 * 1.28, 1e-7);
  EXPECT_TRUE(t.clipped_high);
}

TEST(EvaluatePolicyTokenTest, KlEstimators) {
  PolicyObjective o;
  o.kl_coef = 0.5f;
  o.kl_estimator = KlEstimator::kK1;
  PolicyTokenTerms t = EvaluatePolicyToken(o, -1.0, -1.0, 0.0, -1.5);
  EXPECT_DOUBLE_EQ(t.kl, 0.5);
  EXPECT_DOUBLE_EQ(t.dloss_dlogp, 0.5);  // A = 0: the surrogate's part is 0
  o.kl_estimator = KlEstimator::kK3;
  t = EvaluatePolicyToken(o, -1.0, -1.0, 0.0, -1.5);  // delta = ref - logp = -0.5
  EXPECT_NEAR(t.kl, std::exp(-0.5) + 0.5 - 1.0, 1e-15);
  EXPECT_NEAR(t.dloss_dlogp, 0.5 * (1.0 - std::exp(-0.5)), 1e-15);
  t = EvaluatePolicyToken(o, -1.0, -1.0, 0.0, 12.0);  // e^13 - 14: clamped to 10
  EXPECT_EQ(t.kl, 10.0);
  EXPECT_EQ(t.dloss_dlogp, 0.0);
}

TEST(ValidatePolicyObjectiveTest, NamesTheField) {
  PolicyObjective o;
  o.old_logp = {0.0f, 0.0f};
  o.advantages = {1.0f, 1.0f};
  o.weights = {0.5, 0.5};
  EXPECT_TRUE(ValidatePolicyObjective(o, 2).ok());
  PolicyObjective bad = o;
  bad.clip_low = 1.5f;
  EXPECT_EQ(ValidatePolicyObjective(bad, 2).message(), "clip_low = 1.5 is outside [0, 1]");
  bad = o;
  bad.dual_clip = 0.5f;
  EXPECT_EQ(ValidatePolicyObjective(bad, 2).message(),
            "dual_clip = 0.5 must be in (1, 100] (or 0: none)");
  bad = o;
  bad.kl_coef = 0.1f;
  EXPECT_EQ(ValidatePolicyObjective(bad, 2).message(),
            "kl_coef = 0.1 needs ref_logp (num_tokens fp32)");
  bad = o;
  bad.old_logp = {0.0f};
  EXPECT_EQ(ValidatePolicyObjective(bad, 2).message(),
            "old_logp has 1 entries, expected num_tokens = 2");
  bad = o;
  bad.old_logp[1] = NAN;
  EXPECT_EQ(ValidatePolicyObjective(bad, 2).message(),
            "old_logp[1] = nan is not finite (token 1 counts)");
  bad.weights[1] = 0.0;  // masked: not read
  EXPECT_TRUE(ValidatePolicyObjective(bad, 2).ok());
}

}  // namespace
}  // namespace flce
