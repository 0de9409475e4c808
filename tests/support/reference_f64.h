// An independent float64 implementation of ../shared/MATH.md, written plainly
// with doubles and loops so that every engine can be checked against it. It
// shares no code with any engine and uses no BLAS: a bug here cannot hide the
// same bug in an engine.
//
// Usage:
//   ReferenceInput in = MakeReferenceInput(problem, spec);  // problem.h
//   ReferenceOutput ref = ComputeReference(in);
//   EXPECT_LE(RelativeError(run.grad_input, ref.grad_input), 1e-5);
#ifndef FLCE_TESTS_SUPPORT_REFERENCE_F64_H_
#define FLCE_TESTS_SUPPORT_REFERENCE_F64_H_

#include <cstdint>
#include <vector>

#include "kernels/engine.h"

namespace flce::test {

// MATH.md's "Policy objectives", as plain numbers.
struct ReferencePolicy {
  bool cispo = false;  // else the clipped surrogate (PPO / GRPO / DAPO)
  double clip_low = 0.2;
  double clip_high = 0.2;
  double dual_clip = 0.0;  // 0 = none
  double kl_coef = 0.0;
  bool kl_k3 = true;       // else k1
  double log_ratio_clamp = 20.0;
  std::vector<double> old_logp, advantages, ref_logp, weights;  // per token
};

struct ReferencePolicyStats {
  int64_t tokens = 0, clipped_low = 0, clipped_high = 0, dual_clipped = 0;
  double ratio_sum = 0.0, ratio_min = 0.0, ratio_max = 0.0;
  double old_minus_logp_sum = 0.0, kl_sum = 0.0, surrogate_loss = 0.0, kl_loss = 0.0;
  // How far the sums may move with logp's own rounding (they cancel: signed terms):
  // sum_t |logp_t| + |old_logp_t|, and sum_t |dkl_t/dlogp_t| |logp_t| + |kl_t|.
  double log_ratio_abs = 0.0, kl_abs = 0.0;
};

// MATH.md's "Preference objectives", as plain numbers.
struct ReferencePreference {
  enum Loss { kDpoSigmoid, kIpo, kDpoHinge, kSimPo, kOrpo } loss = kDpoSigmoid;
  double beta = 0.1, gamma = 0.0, label_smoothing = 0.0, normalizer = 0.0;
  int64_t pairs = 0;
  std::vector<int32_t> sequence_of_token;  // per token; -1 = no response's
  std::vector<double> ref_logp;            // per sequence (2 x pairs), or empty
};

struct ReferencePreferenceStats {
  double pair_loss = 0.0, nll_loss = 0.0, chosen_reward_sum = 0.0, rejected_reward_sum = 0.0;
  int64_t reward_accurate = 0;
};

struct ReferenceInput {
  int64_t vocab_size = 0;   // V
  int64_t hidden_size = 0;  // H
  int64_t num_tokens = 0;   // BT
  std::vector<double> weight;  // V x H, row-major
  std::vector<double> bias;    // V, or empty for no bias
  std::vector<double> hidden;  // BT x H, already in the head's dtype's values
  std::vector<int32_t> targets;
  int32_t ignore_index = -100;
  Reduction reduction = Reduction::kMean;
  LossOptions options;
  std::vector<double> token_weights;    // a_t; empty = from the reduction
  std::vector<double> entropy_weights;  // e_t; empty = 0
  bool has_policy = false;
  ReferencePolicy policy;  // with has_policy: a_t = -w_t dL_t/dlogp_t
  bool has_preference = false;
  ReferencePreference preference;  // with has_preference: two passes, a_t = -dL/dlogp_t
};

struct ReferenceOutput {
  double loss = 0.0;         // sum_t a_t l_t
  // sum_t |a_t l_t|: signed token weights (RL-style advantages) make the loss's
  // terms cancel as the gradients' do (see the *_abs sums below).
  double loss_abs = 0.0;
  double z_loss = 0.0;       // sum_t a_t s LSE_t^2
  double entropy_sum = 0.0;  // sum_t entropy_t, every token
  int64_t n_valid = 0;
  int64_t n_correct = 0;
  std::vector<double> per_token_loss;  // BT; 0 for ignored tokens
  std::vector<double> logprob;         // BT; 0 for ignored tokens
  std::vector<double> entropy;         // BT
  std::vector<uint8_t> correct;        // BT
  // Tokens whose `correct` an fp32 engine may legitimately flip: the target's logit and its
  // best competitor lie within the rounding of an fp32 dot product (plus softcap and
  // temperature) of each other, e.g. two logits both saturated by tanh to the cap. Checks
  // excuse exactly these tokens and no others.
  std::vector<uint8_t> correct_uncertain;  // BT
  int64_t n_correct_uncertain = 0;
  std::vector<double> grad_input;      // BT x H
  std::vector<double> grad_weight;     // V x H
  std::vector<double> grad_bias;       // V (zeros when there is no bias)
  // The same sums with every term replaced by its absolute value: sum_i |dr_ti W_ik|,
  // sum_t |dr_ti h_tk|, sum_t |dr_ti|. Where terms cancel (out << out_abs) an fp32 engine
  // cannot be closer than about 2^-24 * out_abs: conformance_checks.cc floors the norm.
  std::vector<double> grad_input_abs;   // BT x H
  std::vector<double> grad_weight_abs;  // V x H
  std::vector<double> grad_bias_abs;    // V
  ReferencePolicyStats policy;          // with a policy objective
  ReferencePreferenceStats preference;  // with a preference objective
};

// Computes everything MATH.md defines for one request. The input is trusted
// (tests build it); targets outside [0, V) other than ignore_index are treated
// as ignored.
ReferenceOutput ComputeReference(const ReferenceInput& input);

}  // namespace flce::test

#endif  // FLCE_TESTS_SUPPORT_REFERENCE_F64_H_
