#include "core/policy_objective.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace flce {

const char* PolicyLossName(PolicyLoss loss) {
  switch (loss) {
    case PolicyLoss::kPpoClip:
      return "ppo_clip";
    case PolicyLoss::kCispo:
      return "cispo";
  }
  return "unknown";
}

const char* KlEstimatorName(KlEstimator estimator) {
  switch (estimator) {
    case KlEstimator::kK1:
      return "k1";
    case KlEstimator::kK3:
      return "k3";
  }
  return "unknown";
}

const char* LossAggregationName(LossAggregation aggregation) {
  switch (aggregation) {
    case LossAggregation::kTokenMean:
      return "token_mean";
    case LossAggregation::kSeqMeanTokenSum:
      return "seq_mean_token_sum";
    case LossAggregation::kSeqMeanTokenMean:
      return "seq_mean_token_mean";
  }
  return "unknown";
}

PolicyTokenTerms EvaluatePolicyToken(const PolicyObjective& objective, double logp,
                                     double old_logp, double advantage, double ref_logp) {
  return EvaluatePolicyTokenT<double>(objective, logp, old_logp, advantage, ref_logp);
}

void PolicyStats::Add(const PolicyTokenTerms& terms, double weight, double kl_coef) {
  ratio_min = tokens == 0 ? terms.ratio : std::min(ratio_min, terms.ratio);
  ratio_max = tokens == 0 ? terms.ratio : std::max(ratio_max, terms.ratio);
  ++tokens;
  clipped_low += terms.clipped_low ? 1 : 0;
  clipped_high += terms.clipped_high ? 1 : 0;
  dual_clipped += terms.dual_clipped ? 1 : 0;
  ratio_sum += terms.ratio;
  old_minus_logp_sum += -terms.log_ratio;
  kl_sum += terms.kl;
  const double kl_part = kl_coef * terms.kl;
  surrogate_loss += weight * (terms.loss - kl_part);
  kl_loss += weight * kl_part;
}

absl::StatusOr<std::vector<double>> PolicyTokenWeights(LossAggregation aggregation,
                                                       const std::vector<uint8_t>& counts,
                                                       const std::vector<int32_t>& sequence_ids,
                                                       double normalizer) {
  const int64_t n = static_cast<int64_t>(counts.size());
  if (!sequence_ids.empty() && static_cast<int64_t>(sequence_ids.size()) != n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sequence_ids has ", sequence_ids.size(), " entries, expected num_tokens = ", n));
  }
  for (int64_t t = 1; t < static_cast<int64_t>(sequence_ids.size()); ++t) {
    if (sequence_ids[t] < sequence_ids[t - 1]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sequence_ids[", t, "] = ", sequence_ids[t], " is below sequence_ids[", t - 1,
          "] = ", sequence_ids[t - 1], ": each sequence is one run of tokens, in order"));
    }
  }
  if (!(normalizer >= 0.0) || !std::isfinite(normalizer)) {
    return absl::InvalidArgumentError(
        absl::StrCat("normalizer = ", normalizer, " must be finite and >= 0 (0: the call's own)"));
  }
  auto same_sequence = [&](int64_t a, int64_t b) {
    return sequence_ids.empty() || sequence_ids[a] == sequence_ids[b];
  };
  // Per run of one sequence: its counted tokens.
  std::vector<double> weights(n, 0.0);
  int64_t total = 0;
  int64_t sequences = 0;
  for (int64_t begin = 0; begin < n;) {
    int64_t end = begin + 1;
    while (end < n && same_sequence(begin, end)) ++end;
    int64_t counted = 0;
    for (int64_t t = begin; t < end; ++t) counted += counts[t] ? 1 : 0;
    total += counted;
    sequences += counted > 0 ? 1 : 0;
    for (int64_t t = begin; t < end; ++t) {
      if (!counts[t]) continue;
      weights[t] = aggregation == LossAggregation::kSeqMeanTokenMean
                       ? 1.0 / static_cast<double>(counted)
                       : 1.0;
    }
    begin = end;
  }
  const double own = aggregation == LossAggregation::kTokenMean ? static_cast<double>(total)
                                                                : static_cast<double>(sequences);
  const double divide_by = normalizer > 0.0 ? normalizer : own;
  for (double& w : weights) w = divide_by > 0.0 ? w / divide_by : 0.0;
  return weights;
}

namespace {

absl::Status CheckRange(const char* name, float value, float lo, float hi) {
  if (!(value >= lo && value <= hi)) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, " = ", value, " is outside [", lo, ", ", hi, "]"));
  }
  return absl::OkStatus();
}

// num_tokens entries, finite wherever the token counts.
absl::Status CheckPerToken(const char* name, const std::vector<float>& values,
                           const std::vector<double>& weights, int64_t num_tokens) {
  if (static_cast<int64_t>(values.size()) != num_tokens) {
    return absl::InvalidArgumentError(absl::StrCat(name, " has ", values.size(),
                                                   " entries, expected num_tokens = ",
                                                   num_tokens));
  }
  for (int64_t t = 0; t < num_tokens; ++t) {
    if (weights[t] != 0.0 && !std::isfinite(values[t])) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, "[", t, "] = ", values[t], " is not finite (token ", t, " counts)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidatePolicyObjective(const PolicyObjective& o, int64_t num_tokens) {
  absl::Status s;
  if (!(s = CheckRange("clip_low", o.clip_low, 0.0f, 1.0f)).ok()) return s;
  if (!(s = CheckRange("clip_high", o.clip_high, 0.0f, PolicyRanges::kMaxClipHigh)).ok()) {
    return s;
  }
  if (o.dual_clip != 0.0f) {
    if (o.loss != PolicyLoss::kPpoClip) {
      return absl::InvalidArgumentError(absl::StrCat(
          "dual_clip = ", o.dual_clip, " applies to ppo_clip only, not ", PolicyLossName(o.loss)));
    }
    if (!(o.dual_clip > 1.0f && o.dual_clip <= PolicyRanges::kMaxDualClip)) {
      return absl::InvalidArgumentError(absl::StrCat("dual_clip = ", o.dual_clip,
                                                     " must be in (1, ",
                                                     PolicyRanges::kMaxDualClip, "] (or 0: none)"));
    }
  }
  if (!(s = CheckRange("kl_coef", o.kl_coef, 0.0f, PolicyRanges::kMaxKlCoef)).ok()) return s;
  if (!(o.log_ratio_clamp > 0.0f && o.log_ratio_clamp <= PolicyRanges::kMaxLogRatioClamp)) {
    return absl::InvalidArgumentError(absl::StrCat("log_ratio_clamp = ", o.log_ratio_clamp,
                                                   " must be in (0, ",
                                                   PolicyRanges::kMaxLogRatioClamp, "]"));
  }
  if (static_cast<int64_t>(o.weights.size()) != num_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("the policy's weights have ", o.weights.size(),
                                                   " entries, expected num_tokens = ",
                                                   num_tokens));
  }
  for (int64_t t = 0; t < num_tokens; ++t) {
    if (!(o.weights[t] >= 0.0) || !std::isfinite(o.weights[t])) {
      return absl::InvalidArgumentError(
          absl::StrCat("the policy's weight of token ", t, " = ", o.weights[t],
                       " must be finite and >= 0"));
    }
  }
  if (!(s = CheckPerToken("old_logp", o.old_logp, o.weights, num_tokens)).ok()) return s;
  if (!(s = CheckPerToken("advantages", o.advantages, o.weights, num_tokens)).ok()) return s;
  if (o.kl_coef > 0.0f) {
    if (o.ref_logp.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("kl_coef = ", o.kl_coef, " needs ref_logp (num_tokens fp32)"));
    }
    if (!(s = CheckPerToken("ref_logp", o.ref_logp, o.weights, num_tokens)).ok()) return s;
  } else if (!o.ref_logp.empty()) {
    return absl::InvalidArgumentError(
        "ref_logp is given but kl_coef = 0: set kl_coef, or leave ref_logp out");
  }
  return absl::OkStatus();
}

}  // namespace flce
