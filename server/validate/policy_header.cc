#include "server/validate/policy_header.h"

#include <cmath>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "flce/v1/convert.h"

namespace flce::server {
namespace {

// A little-endian array of `count` elements of T, or none when `optional`.
template <typename T>
absl::StatusOr<std::vector<T>> Array(const std::string& bytes, const char* field, int64_t count,
                                     const char* element, bool optional) {
  std::vector<T> out;
  if (bytes.empty() && optional) return out;
  const int64_t want = count * static_cast<int64_t>(sizeof(T));
  if (static_cast<int64_t>(bytes.size()) != want) {
    return absl::InvalidArgumentError(absl::StrCat(
        "policy.", field, " has ", bytes.size(), " bytes; expected ", want, " (", count, " x ",
        element, ")", optional ? " or none" : ""));
  }
  out.resize(count);
  std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

}  // namespace

absl::StatusOr<PolicyObjective> PolicyFromHeader(const v1::PolicyObjective& p,
                                                 const std::vector<int32_t>& targets,
                                                 int32_t ignore_index) {
  const int64_t n = static_cast<int64_t>(targets.size());
  PolicyObjective o;
  FLCE_ASSIGN_OR_RETURN(o.loss, PolicyLossFromProto(p.loss()));
  FLCE_ASSIGN_OR_RETURN(o.kl_estimator, KlEstimatorFromProto(p.kl_estimator()));
  FLCE_ASSIGN_OR_RETURN(LossAggregation aggregation, LossAggregationFromProto(p.aggregation()));
  if (p.has_clip_low()) o.clip_low = p.clip_low();
  if (p.has_clip_high()) o.clip_high = p.clip_high();
  o.dual_clip = p.dual_clip();
  o.kl_coef = p.kl_coef();
  if (p.has_log_ratio_clamp()) o.log_ratio_clamp = p.log_ratio_clamp();

  FLCE_ASSIGN_OR_RETURN(std::vector<uint8_t> mask,
                        Array<uint8_t>(p.mask(), "mask", n, "uint8", true));
  std::vector<uint8_t> counts(n);
  for (int64_t t = 0; t < n; ++t) {
    if (!mask.empty() && mask[t] > 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("policy.mask[", t, "] = ", static_cast<int>(mask[t]), " is not 0 or 1"));
    }
    counts[t] = targets[t] != ignore_index && (mask.empty() || mask[t] == 1);
  }
  FLCE_ASSIGN_OR_RETURN(std::vector<int32_t> sequences,
                        Array<int32_t>(p.sequence_ids(), "sequence_ids", n, "int32", true));
  absl::StatusOr<std::vector<double>> weights =
      PolicyTokenWeights(aggregation, counts, sequences, p.normalizer());
  if (!weights.ok()) {
    return absl::Status(weights.status().code(), absl::StrCat("policy.", weights.status().message()));
  }
  o.weights = *std::move(weights);

  FLCE_ASSIGN_OR_RETURN(o.old_logp, Array<float>(p.old_logp(), "old_logp", n, "fp32", false));
  FLCE_ASSIGN_OR_RETURN(o.ref_logp, Array<float>(p.ref_logp(), "ref_logp", n, "fp32", true));
  // Advantages per token, or one per sequence in the order they appear.
  int64_t num_sequences = n > 0 ? 1 : 0;
  for (int64_t t = 1; t < static_cast<int64_t>(sequences.size()); ++t) {
    num_sequences += sequences[t] != sequences[t - 1];
  }
  const int64_t given = static_cast<int64_t>(p.advantages().size() / sizeof(float));
  if (given == num_sequences && given != n &&
      p.advantages().size() % sizeof(float) == 0) {
    FLCE_ASSIGN_OR_RETURN(std::vector<float> per_sequence,
                          Array<float>(p.advantages(), "advantages", num_sequences, "fp32", false));
    o.advantages.resize(n);
    for (int64_t t = 0, s = 0; t < n; ++t) {
      if (t > 0 && sequences[t] != sequences[t - 1]) ++s;
      o.advantages[t] = per_sequence[s];
      // Named as given: by its sequence, not by a token of it.
      if (counts[t] && !std::isfinite(per_sequence[s])) {
        return absl::InvalidArgumentError(absl::StrCat(
            "policy.advantages[", s, "] = ", per_sequence[s], " is not finite (sequence ",
            sequences[t], " has tokens that count)"));
      }
    }
  } else if (static_cast<int64_t>(p.advantages().size()) != n * 4) {
    return absl::InvalidArgumentError(absl::StrCat(
        "policy.advantages has ", p.advantages().size(), " bytes; expected ", n * 4,
        " (num_tokens ", n, " x fp32) or ", num_sequences * 4, " (one fp32 per sequence, ",
        num_sequences, " sequences)"));
  } else {
    FLCE_ASSIGN_OR_RETURN(o.advantages, Array<float>(p.advantages(), "advantages", n, "fp32", false));
  }
  return o;
}

}  // namespace flce::server
