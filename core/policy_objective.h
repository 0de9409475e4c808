// A policy-gradient objective in place of the cross-entropy (docs/MATH.md,
// "Policy objectives"): what an engine needs per token, resolved from the
// wire's per-sequence form (the per-token arithmetic every engine shares is
// policy_token.h's). The loss of token t is a function of its log-prob alone, so an
// engine folds it into the row pass as the weight a_t = -w_t dL_t/dlogp_t on
// the cross-entropy's gradient, inside the chunk that computes logp_t.
#ifndef FLCE_CORE_POLICY_OBJECTIVE_H_
#define FLCE_CORE_POLICY_OBJECTIVE_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/policy_token.h"

namespace flce {

// How the per-token losses become one number (verl's loss_agg_mode names).
enum class LossAggregation {
  kTokenMean,         // sum_t m_t L_t / N, N = sum_t m_t
  kSeqMeanTokenSum,   // sum_s (sum_{t in s} m_t L_t) / S
  kSeqMeanTokenMean,  // sum_s (sum_{t in s} m_t L_t / n_s) / S
};

// "ppo_clip", "cispo"; "k1", "k3"; "token_mean", ... as the docs name them.
const char* PolicyLossName(PolicyLoss loss);
const char* KlEstimatorName(KlEstimator estimator);
const char* LossAggregationName(LossAggregation aggregation);

// The objective's parameters (PolicyTokenParams) and its per-token inputs.
struct PolicyObjective : PolicyTokenParams {
  // Per token (num_tokens each; ref_logp empty without the KL term). w_t is
  // the aggregation's weight, 0 for tokens that do not count (masked,
  // ignored): their old_logp / advantage / ref_logp are not read.
  std::vector<float> old_logp;
  std::vector<float> advantages;
  std::vector<float> ref_logp;
  std::vector<double> weights;
};

using PolicyTokenTerms = PolicyTokenTermsT<double>;

PolicyTokenTerms EvaluatePolicyToken(const PolicyObjective& objective, double logp,
                                     double old_logp, double advantage, double ref_logp);

// Sums over the tokens that count (w_t != 0), in token order; the summary's
// statistics are these over `tokens`.
struct PolicyStats {
  int64_t tokens = 0;
  int64_t clipped_low = 0;
  int64_t clipped_high = 0;
  int64_t dual_clipped = 0;
  double ratio_sum = 0.0;
  double ratio_min = 0.0;  // over the tokens counted; 0 when none
  double ratio_max = 0.0;
  double old_minus_logp_sum = 0.0;  // verl's ppo_kl numerator
  double kl_sum = 0.0;
  double surrogate_loss = 0.0;  // sum_t w_t (L_t - kl_coef kl_t)
  double kl_loss = 0.0;         // sum_t w_t kl_coef kl_t
  void Add(const PolicyTokenTerms& terms, double weight, double kl_coef);
};

// The aggregation's w_t from which tokens count (`counts`: num_tokens, 0 or
// 1), their sequence ids (empty: one sequence; else num_tokens,
// nondecreasing) and the caller's normaliser (0: the call's own N or S;
// > 0 replaces it, so that a batch split over calls sums to one mean).
// seq_mean_token_mean needs each sequence whole in the call. S counts the
// sequences with at least one counted token.
absl::StatusOr<std::vector<double>> PolicyTokenWeights(LossAggregation aggregation,
                                                       const std::vector<uint8_t>& counts,
                                                       const std::vector<int32_t>& sequence_ids,
                                                       double normalizer);

// The objective's own parameters and per-token inputs against num_tokens:
// INVALID_ARGUMENT naming the field (and the first bad token).
absl::Status ValidatePolicyObjective(const PolicyObjective& objective, int64_t num_tokens);

}  // namespace flce

#endif  // FLCE_CORE_POLICY_OBJECTIVE_H_
