// One token's policy objective (docs/MATH.md, "Policy objectives"): its loss
// and dL/dlogp from its log-prob, with autograd's rules at clamps and ties.
// Header-only and free of the standard library's containers so that the CPU
// engine (in double) and the CUDA row kernels (in float) run the same
// arithmetic.
#ifndef FLCE_CORE_POLICY_TOKEN_H_
#define FLCE_CORE_POLICY_TOKEN_H_

#include <cmath>
#include <cstdint>

#include "core/host_device.h"

namespace flce {

enum class PolicyLoss : int32_t {
  kPpoClip,  // PPO / GRPO / DAPO: max(-A r, -A clip(r)), optional dual clip
  kCispo,    // -A sg(clip(r)) logp
};

enum class KlEstimator : int32_t {
  kK1,  // logp - ref_logp
  kK3,  // exp(ref_logp - logp) - (ref_logp - logp) - 1
};

// The ranges every layer accepts (the server's wire check and the engines'
// spec check share them).
struct PolicyRanges {
  static constexpr float kMaxClipHigh = 10.0f;
  static constexpr float kMaxDualClip = 100.0f;
  static constexpr float kMaxKlCoef = 1e3f;
  static constexpr float kMaxLogRatioClamp = 50.0f;
  static constexpr float kDefaultLogRatioClamp = 20.0f;  // verl's
  static constexpr float kKlClamp = 10.0f;               // the k3 estimator's, as verl's
};

// The objective's scalar parameters: what a row kernel needs besides the
// token's own inputs.
struct PolicyTokenParams {
  PolicyLoss loss = PolicyLoss::kPpoClip;
  KlEstimator kl_estimator = KlEstimator::kK3;
  float clip_low = 0.2f;   // epsilon_low: the ratio's lower bound is 1 - clip_low
  float clip_high = 0.2f;  // epsilon_high: its upper bound is 1 + clip_high
  float dual_clip = 0.0f;  // c > 1: -A r is bounded by -c A where A < 0; 0 = none
  float kl_coef = 0.0f;    // beta; > 0 needs ref_logp
  float log_ratio_clamp = PolicyRanges::kDefaultLogRatioClamp;
};

// What one token contributes, from its log-prob under the current weights.
template <typename Real>
struct PolicyTokenTermsT {
  Real loss = 0;         // L_t: the surrogate plus kl_coef x the KL estimate
  Real dloss_dlogp = 0;  // dL_t / dlogp_t, autograd's (ties split as torch splits them)
  Real ratio = 1;        // r_t = exp(clamped logp - old_logp)
  Real log_ratio = 0;    // logp - old_logp, clamped (verl's ppo_kl reads it so)
  Real kl = 0;           // the KL estimate (0 without kl_coef)
  // ppo_clip: the clipped term is the larger and r is below / above its
  // bounds; cispo: r is (its weight is clipped).
  bool clipped_low = false;
  bool clipped_high = false;
  bool dual_clipped = false;  // A < 0 and -c A is the smaller
};

namespace policy_math {

FLCE_HOST_DEVICE float Exp(float x) { return expf(x); }
FLCE_HOST_DEVICE double Exp(double x) { return exp(x); }

// clamp(x, lo, hi) and its autograd derivative: torch.clamp passes the
// gradient where lo <= x <= hi, bounds included.
template <typename Real>
struct Clamped {
  Real value;
  Real slope;
};
template <typename Real>
FLCE_HOST_DEVICE Clamped<Real> Clamp(Real x, Real lo, Real hi) {
  if (x < lo) return {lo, Real(0)};
  if (x > hi) return {hi, Real(0)};
  return {x, Real(1)};
}

// The derivative torch.maximum / torch.minimum give each side: the chosen
// one's, or half of each on a tie.
template <typename Real>
FLCE_HOST_DEVICE Real PickSlope(bool first_chosen, bool tie, Real d_first, Real d_second) {
  if (tie) return Real(0.5) * (d_first + d_second);
  return first_chosen ? d_first : d_second;
}

}  // namespace policy_math

template <typename Real>
FLCE_HOST_DEVICE PolicyTokenTermsT<Real> EvaluatePolicyTokenT(const PolicyTokenParams& o,
                                                                    Real logp, Real old_logp,
                                                                    Real advantage,
                                                                    Real ref_logp) {
  using policy_math::Clamp;
  using policy_math::Exp;
  using policy_math::PickSlope;
  PolicyTokenTermsT<Real> terms;
  const Real A = advantage;
  const auto delta =
      Clamp<Real>(logp - old_logp, -Real(o.log_ratio_clamp), Real(o.log_ratio_clamp));
  terms.log_ratio = delta.value;
  const Real r = Exp(delta.value);
  const Real dr = r * delta.slope;  // dr / dlogp
  terms.ratio = r;
  const Real lo = Real(1) - Real(o.clip_low);
  const Real hi = Real(1) + Real(o.clip_high);
  const auto rc = Clamp<Real>(r, lo, hi);
  if (o.loss == PolicyLoss::kCispo) {
    // The clipped ratio is a constant weight (detached): only logp carries
    // the gradient.
    terms.loss = -A * rc.value * logp;
    terms.dloss_dlogp = -A * rc.value;
    terms.clipped_low = r < lo;
    terms.clipped_high = r > hi;
  } else {
    const Real s1 = -A * r;
    const Real s2 = -A * rc.value;
    const Real ds1 = -A * dr;
    const Real ds2 = -A * rc.slope * dr;
    Real loss = s1 > s2 ? s1 : s2;
    Real dloss = PickSlope<Real>(s1 > s2, s1 == s2, ds1, ds2);
    if (s2 > s1) {
      terms.clipped_low = r < lo;
      terms.clipped_high = r > hi;
    }
    if (o.dual_clip > 0.0f && A < Real(0)) {
      const Real s3 = -A * Real(o.dual_clip);  // a constant
      terms.dual_clipped = loss > s3;
      dloss = PickSlope<Real>(loss < s3, loss == s3, dloss, Real(0));
      loss = loss < s3 ? loss : s3;
    }
    terms.loss = loss;
    terms.dloss_dlogp = dloss;
  }
  if (o.kl_coef > 0.0f) {
    Real kl = 0;
    Real dkl = 0;
    if (o.kl_estimator == KlEstimator::kK1) {
      kl = logp - ref_logp;
      dkl = 1;
    } else {
      const auto d = Clamp<Real>(ref_logp - logp, -Real(PolicyRanges::kDefaultLogRatioClamp),
                                 Real(PolicyRanges::kDefaultLogRatioClamp));
      const Real e = Exp(d.value);
      const auto k = Clamp<Real>(e - d.value - Real(1), -Real(PolicyRanges::kKlClamp),
                                 Real(PolicyRanges::kKlClamp));
      kl = k.value;
      dkl = k.slope * (e - Real(1)) * -d.slope;  // d/dlogp of (ref - logp) is -1
    }
    terms.kl = kl;
    terms.loss += Real(o.kl_coef) * kl;
    terms.dloss_dlogp += Real(o.kl_coef) * dkl;
  }
  return terms;
}

}  // namespace flce

#endif  // FLCE_CORE_POLICY_TOKEN_H_
