// The CPU engine's per-row work on one token's logits: MATH.md's softcap,
// temperature, max / log-sum-exp, loss, logprob, entropy and argmax, then, in
// place, the row's dr (already x grad_scale, x a_t / e_t) for the backward
// GEMMs. One row at a time, nothing shared: rows run on any thread in any
// order and give bitwise the same result.
#ifndef FLCE_KERNELS_CPU_ROW_PASS_H_
#define FLCE_KERNELS_CPU_ROW_PASS_H_

#include <cstdint>

#include "kernels/engine.h"

namespace flce::cpu {

struct RowPassParams {
  int64_t vocab_size = 0;
  const float* bias = nullptr;  // V, or nullptr
  LossOptions options;
  const PolicyObjective* policy = nullptr;  // set: rows come with a PolicyRow
};

// One token's inputs to a policy objective (ComputeSpec::policy).
struct PolicyRow {
  double old_logp = 0.0;
  double advantage = 0.0;
  double ref_logp = 0.0;
  double weight = 0.0;  // w_t; 0: the token does not count
};

struct RowStats {
  double loss = 0.0;     // l_t (L_t under a policy objective); 0 when the target is ignored
  double logprob = 0.0;  // z_y - LSE; 0 when ignored
  double entropy = 0.0;  // LSE - sum_j p_j z_j
  double lse = 0.0;
  bool correct = false;  // argmax z == y (lowest index on ties)
  PolicyTokenTerms policy;  // under a policy objective, for a token that counts
};

// Floats of caller scratch ProcessRow needs per vocabulary entry: exp(z - max)
// and the softcap's derivative.
inline constexpr int64_t kRowScratchPerVocab = 2;

// row: V raw logits (X W^T, no bias) in; when want_dr, V values of dr out
// (otherwise z). scratch: kRowScratchPerVocab x V floats of the caller's.
// target < 0 means ignored; token_weight is a_t (0 for ignored tokens),
// entropy_weight e_t. With `policy` (and params.policy) a_t is instead
// -w_t dL_t/dlogp_t, from the row's own log-prob.
RowStats ProcessRow(const RowPassParams& params, float* row, float* scratch, int32_t target,
                    double token_weight, double entropy_weight, bool want_dr,
                    const PolicyRow* policy = nullptr);

}  // namespace flce::cpu

#endif  // FLCE_KERNELS_CPU_ROW_PASS_H_
