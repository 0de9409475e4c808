#include "server/validate/preference_header.h"

#include <cmath>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "flce/v1/convert.h"

namespace flce::server {
namespace {

// A little-endian array of `count` elements of T, or none when the bytes are empty.
template <typename T>
absl::StatusOr<std::vector<T>> Array(const std::string& bytes, const char* field, int64_t count,
                                     const char* what) {
  std::vector<T> out;
  if (bytes.empty()) return out;
  const int64_t want = count * static_cast<int64_t>(sizeof(T));
  if (static_cast<int64_t>(bytes.size()) != want) {
    return absl::InvalidArgumentError(absl::StrCat("preference.", field, " has ", bytes.size(),
                                                   " bytes; expected ", want, " (", what, ")"));
  }
  out.resize(count);
  std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

}  // namespace

absl::StatusOr<PreferenceObjective> PreferenceFromHeader(const v1::PreferenceObjective& p,
                                                         const std::vector<int32_t>& targets,
                                                         int32_t ignore_index) {
  const int64_t n = static_cast<int64_t>(targets.size());
  PreferenceObjective o;
  FLCE_ASSIGN_OR_RETURN(o.loss, PreferenceLossFromProto(p.loss()));
  if (p.has_beta()) o.beta = p.beta();
  o.gamma = p.gamma();
  o.label_smoothing = p.label_smoothing();
  o.normalizer = p.normalizer();
  if (p.num_pairs() < 1 || p.num_pairs() > n) {
    return absl::InvalidArgumentError(absl::StrCat("preference.num_pairs = ", p.num_pairs(),
                                                   " must be in [1, num_tokens = ", n, "]"));
  }
  o.num_pairs = p.num_pairs();
  const int64_t sequences = 2 * static_cast<int64_t>(o.num_pairs);
  FLCE_ASSIGN_OR_RETURN(o.sequence_of_token,
                        Array<int32_t>(p.sequence_of_token(), "sequence_of_token", n,
                                       "int32 per token"));
  if (o.sequence_of_token.empty()) {
    return absl::InvalidArgumentError(
        "preference.sequence_of_token is missing: int32 per token, its sequence or -1");
  }
  if (!p.ref_logp().empty() && !p.ref_token_logp().empty()) {
    return absl::InvalidArgumentError(
        "preference.ref_logp and preference.ref_token_logp are both given: send one");
  }
  FLCE_ASSIGN_OR_RETURN(std::vector<float> per_sequence,
                        Array<float>(p.ref_logp(), "ref_logp", sequences,
                                     "fp32 per sequence, 2 x num_pairs"));
  FLCE_ASSIGN_OR_RETURN(std::vector<float> per_token,
                        Array<float>(p.ref_token_logp(), "ref_token_logp", n, "fp32 per token"));
  o.ref_logp.assign(per_sequence.begin(), per_sequence.end());
  if (!per_token.empty()) {
    o.ref_logp.assign(sequences, 0.0);
    for (int64_t t = 0; t < n; ++t) {
      const int32_t s = o.sequence_of_token[t];
      if (s < 0 || s >= sequences || targets[t] == ignore_index) continue;
      if (!std::isfinite(per_token[t])) {
        return absl::InvalidArgumentError(absl::StrCat("preference.ref_token_logp[", t, "] = ",
                                                       per_token[t], " is not finite (token ", t,
                                                       " counts for sequence ", s, ")"));
      }
      o.ref_logp[s] += per_token[t];
    }
  }
  return o;
}

}  // namespace flce::server
