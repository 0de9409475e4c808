#include "core/preference_objective.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace flce {

const char* PreferenceLossName(PreferenceLoss loss) {
  switch (loss) {
    case PreferenceLoss::kDpoSigmoid:
      return "dpo_sigmoid";
    case PreferenceLoss::kIpo:
      return "ipo";
    case PreferenceLoss::kDpoHinge:
      return "dpo_hinge";
    case PreferenceLoss::kSimPo:
      return "simpo";
    case PreferenceLoss::kOrpo:
      return "orpo";
  }
  return "unknown";
}

bool PreferenceNeedsReference(PreferenceLoss loss) {
  return loss == PreferenceLoss::kDpoSigmoid || loss == PreferenceLoss::kIpo ||
         loss == PreferenceLoss::kDpoHinge;
}

namespace {

std::string SequenceName(int64_t s) {
  return absl::StrCat("sequence ", s, " (pair ", s / 2, "'s ", s % 2 == 0 ? "chosen" : "rejected",
                      ")");
}

// log(1 + e^x) without overflow, and the logistic function.
double Softplus(double x) { return x > 0.0 ? x + std::log1p(std::exp(-x)) : std::log1p(std::exp(x)); }
double Sigmoid(double x) {
  if (x >= 0.0) return 1.0 / (1.0 + std::exp(-x));
  const double e = std::exp(x);
  return e / (1.0 + e);
}

}  // namespace

absl::Status ValidatePreferenceObjective(const PreferenceObjective& o,
                                         const std::vector<uint8_t>& counts) {
  const int64_t n = static_cast<int64_t>(counts.size());
  const char* name = PreferenceLossName(o.loss);
  if (!(o.beta > 0.0f && o.beta <= PreferenceRanges::kMaxBeta)) {
    return absl::InvalidArgumentError(
        absl::StrCat("beta = ", o.beta, " must be in (0, ", PreferenceRanges::kMaxBeta, "]"));
  }
  if (o.gamma != 0.0f) {
    if (o.loss != PreferenceLoss::kSimPo) {
      return absl::InvalidArgumentError(
          absl::StrCat("gamma = ", o.gamma, " applies to simpo only, not ", name));
    }
    if (!(o.gamma >= 0.0f && o.gamma <= PreferenceRanges::kMaxGamma)) {
      return absl::InvalidArgumentError(absl::StrCat("gamma = ", o.gamma, " must be in [0, ",
                                                     PreferenceRanges::kMaxGamma, "]"));
    }
  }
  if (o.label_smoothing != 0.0f) {
    if (o.loss != PreferenceLoss::kDpoSigmoid) {
      return absl::InvalidArgumentError(absl::StrCat(
          "label_smoothing = ", o.label_smoothing, " applies to dpo_sigmoid only, not ", name));
    }
    if (!(o.label_smoothing > 0.0f && o.label_smoothing < PreferenceRanges::kMaxLabelSmoothing)) {
      return absl::InvalidArgumentError(absl::StrCat("label_smoothing = ", o.label_smoothing,
                                                     " must be in [0, 0.5)"));
    }
  }
  if (!(o.normalizer >= 0.0) || !std::isfinite(o.normalizer)) {
    return absl::InvalidArgumentError(
        absl::StrCat("normalizer = ", o.normalizer, " must be finite and >= 0 (0: the pairs)"));
  }
  if (o.normalizer > 0.0 && o.loss == PreferenceLoss::kOrpo) {
    return absl::InvalidArgumentError(
        "normalizer does not combine with orpo: its NLL is a token mean over the call's chosen "
        "tokens");
  }
  if (o.num_pairs < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_pairs = ", o.num_pairs, ": a preference call needs at least one pair"));
  }
  const int64_t sequences = 2 * static_cast<int64_t>(o.num_pairs);
  if (static_cast<int64_t>(o.sequence_of_token.size()) != n) {
    return absl::InvalidArgumentError(absl::StrCat("sequence_of_token has ",
                                                   o.sequence_of_token.size(),
                                                   " entries, expected num_tokens = ", n));
  }
  std::vector<int64_t> counted(sequences, 0);
  for (int64_t t = 0; t < n; ++t) {
    const int32_t s = o.sequence_of_token[t];
    if (s < -1 || s >= sequences) {
      return absl::InvalidArgumentError(
          absl::StrCat("sequence_of_token[", t, "] = ", s, " is outside [-1, ", sequences,
                       ") (2 x num_pairs = ", sequences, " sequences; -1: no response's)"));
    }
    if (s >= 0 && counts[t]) ++counted[s];
  }
  for (int64_t s = 0; s < sequences; ++s) {
    if (counted[s] == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          SequenceName(s), " has no token that counts (none, or all ignore_index)"));
    }
  }
  if (PreferenceNeedsReference(o.loss)) {
    if (static_cast<int64_t>(o.ref_logp.size()) != sequences) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, " needs ref_logp: one per sequence (", sequences, "), got ", o.ref_logp.size()));
    }
    for (int64_t s = 0; s < sequences; ++s) {
      if (!std::isfinite(o.ref_logp[s])) {
        return absl::InvalidArgumentError(absl::StrCat("ref_logp[", s, "] = ", o.ref_logp[s],
                                                       " of ", SequenceName(s),
                                                       " is not finite"));
      }
    }
  } else if (!o.ref_logp.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, " uses no reference: leave ref_logp out"));
  }
  return absl::OkStatus();
}

PreferenceEvaluation EvaluatePreference(const PreferenceObjective& o,
                                        const std::vector<float>& logp,
                                        const std::vector<uint8_t>& counts) {
  const int64_t n = static_cast<int64_t>(counts.size());
  const int64_t pairs = o.num_pairs;
  const int64_t sequences = 2 * pairs;
  std::vector<double> sum(sequences, 0.0), count(sequences, 0.0);
  for (int64_t t = 0; t < n; ++t) {
    const int32_t s = o.sequence_of_token[t];
    if (s < 0 || !counts[t]) continue;
    sum[s] += logp[t];
    count[s] += 1.0;
  }
  const double k = 1.0 / (o.normalizer > 0.0 ? o.normalizer : static_cast<double>(pairs));
  const double beta = o.beta;
  PreferenceEvaluation ev;
  PreferenceStats& st = ev.stats;
  st.pairs = pairs;
  // dloss / dS_s, S_s the sequence's summed log-prob.
  std::vector<double> dsum(sequences, 0.0);
  double chosen_tokens = 0.0;
  for (int64_t p = 0; p < pairs; ++p) {
    const int64_t c = 2 * p, r = 2 * p + 1;
    chosen_tokens += count[c];
    double loss = 0.0, reward_c = 0.0, reward_r = 0.0;
    switch (o.loss) {
      case PreferenceLoss::kDpoSigmoid:
      case PreferenceLoss::kDpoHinge: {
        const double h = (sum[c] - o.ref_logp[c]) - (sum[r] - o.ref_logp[r]);
        double dh;
        if (o.loss == PreferenceLoss::kDpoSigmoid) {
          const double eps = o.label_smoothing;
          const double x = beta * h;
          loss = (1.0 - eps) * Softplus(-x) + eps * Softplus(x);
          dh = beta * (-(1.0 - eps) * Sigmoid(-x) + eps * Sigmoid(x));
        } else {
          loss = std::max(0.0, 1.0 - beta * h);
          dh = 1.0 - beta * h > 0.0 ? -beta : 0.0;  // relu's gradient at 0 is 0
        }
        dsum[c] = k * dh;
        dsum[r] = -k * dh;
        reward_c = beta * (sum[c] - o.ref_logp[c]);
        reward_r = beta * (sum[r] - o.ref_logp[r]);
        break;
      }
      case PreferenceLoss::kIpo: {
        const double mc = (sum[c] - o.ref_logp[c]) / count[c];
        const double mr = (sum[r] - o.ref_logp[r]) / count[r];
        const double h = mc - mr;
        const double d = h - 1.0 / (2.0 * beta);
        loss = d * d;
        dsum[c] = k * 2.0 * d / count[c];
        dsum[r] = -k * 2.0 * d / count[r];
        reward_c = beta * mc;
        reward_r = beta * mr;
        break;
      }
      case PreferenceLoss::kSimPo: {
        const double mc = sum[c] / count[c], mr = sum[r] / count[r];
        const double x = beta * (mc - mr) - o.gamma;
        loss = Softplus(-x);
        const double dh = -beta * Sigmoid(-x);
        dsum[c] = k * dh / count[c];
        dsum[r] = -k * dh / count[r];
        reward_c = beta * mc;
        reward_r = beta * mr;
        break;
      }
      case PreferenceLoss::kOrpo: {
        // log-odds of the length-averaged log-prob m: m - log(1 - e^m), with
        // log(-expm1(m)) for a small 1 - e^m; m kept below 0 so that it
        // stays finite when every token is certain.
        const double mc = std::min(sum[c] / count[c], -1e-7);
        const double mr = std::min(sum[r] / count[r], -1e-7);
        const double x = (mc - std::log(-std::expm1(mc))) - (mr - std::log(-std::expm1(mr)));
        loss = beta * Softplus(-x);
        const double dx = -beta * Sigmoid(-x);
        // d(log-odds)/dm = -1 / expm1(m); the clamp passes no gradient.
        const double dmc = sum[c] / count[c] < -1e-7 ? dx * -1.0 / std::expm1(mc) : 0.0;
        const double dmr = sum[r] / count[r] < -1e-7 ? -dx * -1.0 / std::expm1(mr) : 0.0;
        dsum[c] = k * dmc / count[c];
        dsum[r] = k * dmr / count[r];
        reward_c = beta * mc;
        reward_r = beta * mr;
        break;
      }
    }
    st.pair_loss += k * loss;
    st.chosen_reward_sum += reward_c;
    st.rejected_reward_sum += reward_r;
    st.reward_accurate += reward_c > reward_r ? 1 : 0;
    st.chosen_logp_sum += sum[c];
    st.rejected_logp_sum += sum[r];
  }
  ev.token_weights.assign(n, 0.0f);
  for (int64_t t = 0; t < n; ++t) {
    const int32_t s = o.sequence_of_token[t];
    if (s < 0 || !counts[t]) continue;
    double d = dsum[s];
    if (o.loss == PreferenceLoss::kOrpo && s % 2 == 0) {
      st.nll_loss += -logp[t] / chosen_tokens;
      d += -1.0 / chosen_tokens;
    }
    ev.token_weights[t] = static_cast<float>(-d);  // the cross-entropy's l_t is -logp_t
  }
  ev.loss = st.pair_loss + st.nll_loss;
  return ev;
}

}  // namespace flce
