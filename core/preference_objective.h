// A sequence-level preference objective in place of the cross-entropy
// (docs/MATH.md, "Preference objectives"): DPO and its IPO / hinge variants,
// SimPO and ORPO over pairs of a chosen and a rejected response. A pair's loss
// needs each response's whole log-prob, so an engine computes it in two
// passes over the call's rows: the log-probs first, then the cross-entropy's
// gradient weighted by a_t = -dL/dlogp_t, which this file derives from them.
#ifndef FLCE_CORE_PREFERENCE_OBJECTIVE_H_
#define FLCE_CORE_PREFERENCE_OBJECTIVE_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace flce {

enum class PreferenceLoss : int32_t {
  kDpoSigmoid,  // -log sigma(beta h), h the log-ratio margin (label smoothing: cDPO)
  kIpo,         // (h - 1/(2 beta))^2 on length-averaged log-probs
  kDpoHinge,    // max(0, 1 - beta h)
  kSimPo,       // -log sigma(beta (mean_c - mean_r) - gamma), no reference
  kOrpo,        // chosen NLL + lambda (-log sigma(log-odds_c - log-odds_r)), no reference
};

// "dpo_sigmoid", "ipo", "dpo_hinge", "simpo", "orpo".
const char* PreferenceLossName(PreferenceLoss loss);
// Whether the loss reads the reference's log-probs.
bool PreferenceNeedsReference(PreferenceLoss loss);

struct PreferenceRanges {
  static constexpr float kMaxBeta = 1e3f;
  static constexpr float kMaxGamma = 100.0f;
  static constexpr float kMaxLabelSmoothing = 0.5f;  // exclusive
};

struct PreferenceObjective {
  PreferenceLoss loss = PreferenceLoss::kDpoSigmoid;
  float beta = 0.1f;             // DPO's beta; SimPO's beta; ORPO's lambda
  float gamma = 0.0f;            // SimPO's target margin
  float label_smoothing = 0.0f;  // dpo_sigmoid only: the preference's assumed flip rate
  int32_t num_pairs = 0;         // P: sequences 2p (chosen) and 2p + 1 (rejected)
  // Per token: its sequence in [0, 2P), or -1 for a token of no response (a
  // prompt, padding). A token whose target is ignore_index does not count
  // either; every sequence needs a token that counts.
  std::vector<int32_t> sequence_of_token;
  // Per sequence (2P; the losses with a reference only): the reference
  // policy's log-prob of the response, summed over the tokens that count.
  std::vector<double> ref_logp;
  double normalizer = 0.0;  // > 0: divides instead of P (pairs split over calls)
};

// Over the call's pairs. Rewards as TRL logs them: beta times the policy's
// and the reference's log-prob difference (DPO family), beta times the
// length-averaged log-prob (SimPO), the length-averaged log-prob (ORPO).
struct PreferenceStats {
  int64_t pairs = 0;
  double pair_loss = 0.0;  // the pairs' part of the loss (all but ORPO's NLL)
  double nll_loss = 0.0;   // ORPO's chosen NLL (token mean over the chosen tokens)
  double chosen_reward_sum = 0.0;
  double rejected_reward_sum = 0.0;
  int64_t reward_accurate = 0;  // chosen reward > rejected reward
  double chosen_logp_sum = 0.0;    // sum over pairs of the chosen response's log-prob
  double rejected_logp_sum = 0.0;
};

struct PreferenceEvaluation {
  double loss = 0.0;
  std::vector<float> token_weights;  // a_t = -dloss/dlogp_t, num_tokens
  PreferenceStats stats;
};

// The objective against num_tokens and which tokens count (`counts`, 0 or 1
// per token: its target is not ignore_index): INVALID_ARGUMENT naming the
// field, the value and the first bad token or sequence.
absl::Status ValidatePreferenceObjective(const PreferenceObjective& objective,
                                         const std::vector<uint8_t>& counts);

// The loss and a_t from the log-probs of the first pass (num_tokens; read
// only where a token counts). The objective has been validated.
PreferenceEvaluation EvaluatePreference(const PreferenceObjective& objective,
                                        const std::vector<float>& logp,
                                        const std::vector<uint8_t>& counts);

}  // namespace flce

#endif  // FLCE_CORE_PREFERENCE_OBJECTIVE_H_
