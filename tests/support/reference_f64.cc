#include "tests/support/reference_f64.h"

#include <algorithm>
#include <cmath>
#include <cstddef>

namespace flce::test {
namespace {

bool IsValid(const ReferenceInput& in, int32_t target) {
  return target != in.ignore_index && target >= 0 && target < in.vocab_size;
}

// a_t of MATH.md: the caller's weights replace the reduction's; ignored
// tokens always get 0.
double TokenWeight(const ReferenceInput& in, int64_t t, int64_t n_valid) {
  if (!IsValid(in, in.targets[t])) return 0.0;
  if (!in.token_weights.empty()) return in.token_weights[t];
  switch (in.reduction) {
    case Reduction::kMean:
      return n_valid > 0 ? 1.0 / static_cast<double>(n_valid) : 0.0;
    case Reduction::kSum:
    case Reduction::kNone:
      return 1.0;
  }
  return 0.0;
}

// A bound on how far an fp32 engine's logit z_j may lie from the exact one: the dot product
// of H products plus the bias, accumulated in any order (gamma_{H+1} |terms|, taken as
// (H + 2) u), carried through the softcap by its derivative cap_slope = 1 - tanh^2 <= 1,
// plus a few roundings of tanh, the multiply by the cap and the division by tau.
double Fp32LogitError(double abs_terms, int64_t hidden_size, double cap_slope, double capped,
                      double tau) {
  constexpr double kU = 0x1p-24;
  const double before_cap = static_cast<double>(hidden_size + 2) * kU * abs_terms;
  return (before_cap * cap_slope + 4.0 * kU * std::abs(capped)) / tau;
}

// Whether rounding within z_err could flip "argmax == y": a correct token could lose to a
// competitor whose upper bound reaches the target's lower bound; an incorrect one could win
// if its upper bound reaches every competitor's lower bound.
bool CorrectIsUncertain(const std::vector<double>& z, const std::vector<double>& z_err, int32_t y,
                        bool correct) {
  double best_upper = -INFINITY;
  double best_lower = -INFINITY;
  for (size_t j = 0; j < z.size(); ++j) {
    if (static_cast<int32_t>(j) == y) continue;
    best_upper = std::max(best_upper, z[j] + z_err[j]);
    best_lower = std::max(best_lower, z[j] - z_err[j]);
  }
  if (correct) return z[y] - z_err[y] <= best_upper;
  return z[y] + z_err[y] >= best_lower;
}

// What torch's autograd gives d max(a, b) (and d min): the chosen side's
// derivative, half of each on a tie.
double Chosen(bool first, bool tie, double d_first, double d_second) {
  return tie ? 0.5 * (d_first + d_second) : (first ? d_first : d_second);
}

// torch.clamp: the value, and whether the gradient passes (bounds included).
double ClampTo(double x, double lo, double hi, bool* passes) {
  *passes = x >= lo && x <= hi;
  return x < lo ? lo : (x > hi ? hi : x);
}

// MATH.md's L_t and dL_t/dlogp_t of a token that counts; stats gathered.
double PolicyTerm(const ReferencePolicy& pol, int64_t t, double logp, double* dloss,
                  ReferencePolicyStats* stats) {
  const double A = pol.advantages[t];
  const double lo = 1.0 - pol.clip_low;
  const double hi = 1.0 + pol.clip_high;
  bool passes = false;
  const double log_ratio =
      ClampTo(logp - pol.old_logp[t], -pol.log_ratio_clamp, pol.log_ratio_clamp, &passes);
  const double ratio = std::exp(log_ratio);
  const double d_ratio = passes ? ratio : 0.0;
  bool inside = false;
  const double clipped = ClampTo(ratio, lo, hi, &inside);
  double loss = 0.0;
  double d = 0.0;
  bool low = false, high = false, dual = false;
  if (pol.cispo) {
    loss = -A * clipped * logp;
    d = -A * clipped;
    low = ratio < lo;
    high = ratio > hi;
  } else {
    const double plain = -A * ratio;
    const double capped = -A * clipped;
    loss = plain >= capped ? plain : capped;
    d = Chosen(plain > capped, plain == capped, -A * d_ratio, inside ? -A * d_ratio : 0.0);
    low = capped > plain && ratio < lo;
    high = capped > plain && ratio > hi;
    if (pol.dual_clip > 0.0 && A < 0.0) {
      const double bound = -A * pol.dual_clip;
      dual = loss > bound;
      d = Chosen(loss < bound, loss == bound, d, 0.0);
      loss = loss <= bound ? loss : bound;
    }
  }
  double kl = 0.0;
  double dkl = 0.0;
  if (pol.kl_coef > 0.0) {
    dkl = 1.0;
    if (pol.kl_k3) {
      bool in_delta = false, in_kl = false;
      const double delta = ClampTo(pol.ref_logp[t] - logp, -20.0, 20.0, &in_delta);
      kl = ClampTo(std::exp(delta) - delta - 1.0, -10.0, 10.0, &in_kl);
      dkl = (in_delta && in_kl) ? 1.0 - std::exp(delta) : 0.0;
    } else {
      kl = logp - pol.ref_logp[t];
    }
    loss += pol.kl_coef * kl;
    d += pol.kl_coef * dkl;
  }
  const double w = pol.weights[t];
  if (stats->tokens == 0 || ratio < stats->ratio_min) stats->ratio_min = ratio;
  if (stats->tokens == 0 || ratio > stats->ratio_max) stats->ratio_max = ratio;
  ++stats->tokens;
  stats->clipped_low += low;
  stats->clipped_high += high;
  stats->dual_clipped += dual;
  stats->ratio_sum += ratio;
  stats->old_minus_logp_sum -= log_ratio;  // clamped, as verl's ppo_kl
  stats->kl_sum += kl;
  stats->log_ratio_abs += std::abs(logp) + std::abs(pol.old_logp[t]);
  stats->kl_abs += std::abs(dkl * logp) + std::abs(kl);
  stats->surrogate_loss += w * (loss - pol.kl_coef * kl);
  stats->kl_loss += w * pol.kl_coef * kl;
  *dloss = d;
  return loss;
}

}  // namespace

namespace {

// One pair's loss from its responses' summed log-probs (S), counted tokens
// (n) and the reference's sums, as MATH.md writes it.
double PairLoss(const ReferencePreference& o, double s_c, double s_r, double n_c, double n_r,
                double ref_c, double ref_r) {
  auto softplus = [](double x) { return std::log1p(std::exp(-std::abs(x))) + std::max(x, 0.0); };
  switch (o.loss) {
    case ReferencePreference::kDpoSigmoid: {
      const double x = o.beta * ((s_c - ref_c) - (s_r - ref_r));
      return (1.0 - o.label_smoothing) * softplus(-x) + o.label_smoothing * softplus(x);
    }
    case ReferencePreference::kIpo: {
      const double h = (s_c - ref_c) / n_c - (s_r - ref_r) / n_r;
      return (h - 1.0 / (2.0 * o.beta)) * (h - 1.0 / (2.0 * o.beta));
    }
    case ReferencePreference::kDpoHinge:
      return std::max(0.0, 1.0 - o.beta * ((s_c - ref_c) - (s_r - ref_r)));
    case ReferencePreference::kSimPo:
      return softplus(-(o.beta * (s_c / n_c - s_r / n_r) - o.gamma));
    case ReferencePreference::kOrpo: {
      auto log_odds = [](double m) {
        m = std::min(m, -1e-7);
        return m - std::log(1.0 - std::exp(m));
      };
      return o.beta * softplus(-(log_odds(s_c / n_c) - log_odds(s_r / n_r)));
    }
  }
  return 0.0;
}

// The two passes: the log-probs from a plain run, the objective and its
// derivatives by the sequences' sums (central differences: no calculus shared
// with the engines), then a run weighted by a_t = -dL/dlogp_t.
ReferenceOutput PreferenceReference(const ReferenceInput& in) {
  const ReferencePreference& o = in.preference;
  ReferenceInput plain = in;
  plain.has_preference = false;
  plain.token_weights.clear();
  plain.reduction = Reduction::kSum;
  const ReferenceOutput first = ComputeReference(plain);
  const int64_t sequences = 2 * o.pairs;
  std::vector<double> sum(sequences, 0.0), count(sequences, 0.0);
  double chosen_tokens = 0.0;
  for (int64_t t = 0; t < in.num_tokens; ++t) {
    const int32_t s = o.sequence_of_token[t];
    if (s < 0 || !IsValid(in, in.targets[t])) continue;
    sum[s] += first.logprob[t];
    count[s] += 1.0;
    if (s % 2 == 0) chosen_tokens += 1.0;
  }
  const double k = 1.0 / (o.normalizer > 0.0 ? o.normalizer : static_cast<double>(o.pairs));
  std::vector<double> dsum(sequences, 0.0);
  ReferencePreferenceStats stats;
  for (int64_t p = 0; p < o.pairs; ++p) {
    const int64_t c = 2 * p, r = c + 1;
    const double ref_c = o.ref_logp.empty() ? 0.0 : o.ref_logp[c];
    const double ref_r = o.ref_logp.empty() ? 0.0 : o.ref_logp[r];
    auto loss = [&](double s_c, double s_r) {
      return PairLoss(o, s_c, s_r, count[c], count[r], ref_c, ref_r);
    };
    const double hc = 1e-6 * std::max(1.0, std::abs(sum[c]));
    const double hr = 1e-6 * std::max(1.0, std::abs(sum[r]));
    dsum[c] = k * (loss(sum[c] + hc, sum[r]) - loss(sum[c] - hc, sum[r])) / (2.0 * hc);
    dsum[r] = k * (loss(sum[c], sum[r] + hr) - loss(sum[c], sum[r] - hr)) / (2.0 * hr);
    stats.pair_loss += k * loss(sum[c], sum[r]);
    double reward_c, reward_r;
    if (o.loss == ReferencePreference::kSimPo) {
      reward_c = o.beta * sum[c] / count[c];
      reward_r = o.beta * sum[r] / count[r];
    } else if (o.loss == ReferencePreference::kOrpo) {
      reward_c = o.beta * std::min(sum[c] / count[c], -1e-7);
      reward_r = o.beta * std::min(sum[r] / count[r], -1e-7);
    } else if (o.loss == ReferencePreference::kIpo) {
      reward_c = o.beta * (sum[c] - ref_c) / count[c];
      reward_r = o.beta * (sum[r] - ref_r) / count[r];
    } else {
      reward_c = o.beta * (sum[c] - ref_c);
      reward_r = o.beta * (sum[r] - ref_r);
    }
    stats.chosen_reward_sum += reward_c;
    stats.rejected_reward_sum += reward_r;
    stats.reward_accurate += reward_c > reward_r ? 1 : 0;
  }
  ReferenceInput weighted = in;
  weighted.has_preference = false;
  weighted.token_weights.assign(in.num_tokens, 0.0);
  for (int64_t t = 0; t < in.num_tokens; ++t) {
    const int32_t s = o.sequence_of_token[t];
    if (s < 0 || !IsValid(in, in.targets[t])) continue;
    double d = dsum[s];
    if (o.loss == ReferencePreference::kOrpo && s % 2 == 0) {
      // ORPO's NLL: the mean of -logp over the call's chosen tokens.
      stats.nll_loss += -first.logprob[t] / chosen_tokens;
      d -= 1.0 / chosen_tokens;
    }
    weighted.token_weights[t] = -d;
  }
  ReferenceOutput out = ComputeReference(weighted);
  out.loss = stats.pair_loss + stats.nll_loss;
  out.loss_abs = std::abs(stats.pair_loss) + std::abs(stats.nll_loss);
  out.z_loss = 0.0;
  out.preference = stats;
  return out;
}

}  // namespace

ReferenceOutput ComputeReference(const ReferenceInput& in) {
  if (in.has_preference) return PreferenceReference(in);
  const int64_t V = in.vocab_size;
  const int64_t H = in.hidden_size;
  const int64_t BT = in.num_tokens;
  const double eps = in.options.label_smoothing;
  const double s = in.options.z_loss_scale;
  const double cap = in.options.softcap;
  const double tau = in.options.temperature;
  const double gscale = in.options.grad_scale;

  ReferenceOutput out;
  out.per_token_loss.assign(BT, 0.0);
  out.logprob.assign(BT, 0.0);
  out.entropy.assign(BT, 0.0);
  out.correct.assign(BT, 0);
  out.correct_uncertain.assign(BT, 0);
  out.grad_input.assign(BT * H, 0.0);
  out.grad_weight.assign(V * H, 0.0);
  out.grad_bias.assign(V, 0.0);
  out.grad_input_abs.assign(BT * H, 0.0);
  out.grad_weight_abs.assign(V * H, 0.0);
  out.grad_bias_abs.assign(V, 0.0);
  for (int64_t t = 0; t < BT; ++t) {
    if (IsValid(in, in.targets[t])) ++out.n_valid;
  }

  std::vector<double> u(V), z(V), p(V), z_err(V);
  for (int64_t t = 0; t < BT; ++t) {
    const double* h = &in.hidden[t * H];
    const int32_t y = in.targets[t];
    const bool valid = IsValid(in, y);
    double a = TokenWeight(in, t, out.n_valid);
    double policy_a = 0.0;  // under a policy objective: the gradient's weight
    const double e = in.entropy_weights.empty() ? 0.0 : in.entropy_weights[t];

    for (int64_t j = 0; j < V; ++j) {
      double r = in.bias.empty() ? 0.0 : in.bias[j];
      double r_abs = std::abs(r);
      for (int64_t k = 0; k < H; ++k) {
        r += in.weight[j * H + k] * h[k];
        r_abs += std::abs(in.weight[j * H + k] * h[k]);
      }
      u[j] = cap > 0.0 ? cap * std::tanh(r / cap) : r;
      z[j] = u[j] / tau;
      z_err[j] = Fp32LogitError(r_abs, H, cap > 0.0 ? 1.0 - (u[j] / cap) * (u[j] / cap) : 1.0,
                                u[j], tau);
    }
    double m = z[0];
    int64_t argmax = 0;
    for (int64_t j = 1; j < V; ++j) {
      if (z[j] > m) {  // strict: ties stay at the lowest index
        m = z[j];
        argmax = j;
      }
    }
    double sum_exp = 0.0;
    for (int64_t j = 0; j < V; ++j) sum_exp += std::exp(z[j] - m);
    const double lse = m + std::log(sum_exp);
    double sum_z = 0.0;
    double sum_pz = 0.0;
    for (int64_t j = 0; j < V; ++j) {
      p[j] = std::exp(z[j] - lse);
      sum_z += z[j];
      sum_pz += p[j] * z[j];
    }
    const double entropy = lse - sum_pz;
    out.entropy[t] = entropy;
    out.entropy_sum += entropy;
    if (valid) {
      double loss = lse - (1.0 - eps) * z[y] - (eps / V) * sum_z + s * lse * lse;
      if (in.has_policy) {
        // L_t replaces l_t; the gradient is the cross-entropy's (eps = s = 0) times
        // -w_t dL_t/dlogp_t. Tokens that do not count weigh nothing.
        const double w = in.policy.weights[t];
        double dloss = 0.0;
        loss = w != 0.0 ? PolicyTerm(in.policy, t, z[y] - lse, &dloss, &out.policy) : 0.0;
        a = w != 0.0 ? w : 0.0;
        policy_a = -w * dloss;
      }
      out.per_token_loss[t] = loss;
      out.logprob[t] = z[y] - lse;
      out.correct[t] = argmax == y ? 1 : 0;
      out.n_correct += out.correct[t];
      out.correct_uncertain[t] = CorrectIsUncertain(z, z_err, y, out.correct[t] != 0) ? 1 : 0;
      out.n_correct_uncertain += out.correct_uncertain[t];
      out.loss += a * loss;
      out.loss_abs += std::abs(a * loss);
      out.z_loss += a * s * lse * lse;
      if (in.has_policy) a = policy_a;
    }

    for (int64_t j = 0; j < V; ++j) {
      double dloss = p[j] * (1.0 + 2.0 * s * lse) - eps / V;
      if (valid && j == y) dloss -= 1.0 - eps;
      const double dentropy = -p[j] * (z[j] - sum_pz);
      const double dz = gscale * (a * dloss + e * dentropy);
      double dr = dz / tau;
      if (cap > 0.0) dr *= 1.0 - (u[j] / cap) * (u[j] / cap);
      if (dr == 0.0) continue;
      for (int64_t k = 0; k < H; ++k) {
        out.grad_input[t * H + k] += dr * in.weight[j * H + k];
        out.grad_weight[j * H + k] += dr * h[k];
        out.grad_input_abs[t * H + k] += std::abs(dr * in.weight[j * H + k]);
        out.grad_weight_abs[j * H + k] += std::abs(dr * h[k]);
      }
      out.grad_bias[j] += dr;
      out.grad_bias_abs[j] += std::abs(dr);
    }
  }
  return out;
}

}  // namespace flce::test
