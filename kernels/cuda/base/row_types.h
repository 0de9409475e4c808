// Plain structs shared by the row kernels and the host code that launches
// them: MATH.md's per-call options and the per-row inputs and outputs.
#ifndef FLCE_KERNELS_CUDA_BASE_ROW_TYPES_H_
#define FLCE_KERNELS_CUDA_BASE_ROW_TYPES_H_

#include <cstdint>

#include "core/compute_options.h"
#include "core/policy_token.h"

namespace flce::cuda {

// The call's LossOptions as they are (a new option reaches the kernels with its
// field), with what the kernels derive from the call.
struct LossParams : LossOptions {
  int64_t vocab = 0;  // real V: columns >= vocab are padding, excluded everywhere
  // Some e_t != 0: the backward needs per-element entropy terms, so the
  // logits-stats path keeps its dlogits pass (a hint; rows are checked again).
  bool entropy_weighted = false;
  // A policy objective replaces the cross-entropy (ComputeSpec::policy): the
  // row's loss is L_t and a_t becomes -w_t dL_t/dlogp_t (RowInputs carry w_t
  // as token_weight and the objective's per-token inputs).
  bool has_policy = false;
  PolicyTokenParams policy;
};

// Device arrays, one entry per row of the launch.
struct RowInputs {
  const int32_t* target = nullptr;        // -1 = ignored
  const float* token_weight = nullptr;    // a_t (0 for ignored tokens)
  const float* entropy_weight = nullptr;  // e_t
  // Under a policy objective (else null); ref_logp is read only with kl_coef.
  const float* old_logp = nullptr;
  const float* advantage = nullptr;
  const float* ref_logp = nullptr;
};

// Device arrays, one entry per row of the launch.
struct RowOutputs {
  float* loss = nullptr;     // l_t (0 for ignored tokens)
  float* z_loss = nullptr;   // s LSE^2 (0 for ignored tokens)
  float* logprob = nullptr;  // z_y - LSE (0 for ignored tokens)
  float* entropy = nullptr;
  int32_t* argmax = nullptr;
  // Under a policy objective, for the tokens that count (w_t != 0).
  float* ratio = nullptr;      // r_t
  float* log_ratio = nullptr;  // the clamped logp - old_logp
  float* kl = nullptr;         // the KL estimate
  int32_t* policy_flags = nullptr;  // kPolicyClippedLow | kPolicyClippedHigh | kPolicyDualClipped
};

enum PolicyFlag : int32_t {
  kPolicyClippedLow = 1,
  kPolicyClippedHigh = 2,
  kPolicyDualClipped = 4,
};

// The row arrays a call may carry, each one entry per token: the inputs
// (target, a_t, e_t, then the objective's old_logp, advantage, ref_logp) and
// the outputs (loss, z-loss, logprob, entropy, argmax, then the objective's
// ratio, log-ratio, KL, flags). Calls without an objective use the first
// three and the first five.
constexpr int kRowInputs = 6;
constexpr int kPlainRowInputs = 3;
constexpr int kRowOutputs = 9;
constexpr int kPlainRowOutputs = 5;

// Both sets of row pointers moved `begin` rows on (null stays null).
inline RowInputs ShiftRows(RowInputs in, int64_t begin) {
  auto shift = [begin](auto* p) { return p == nullptr ? p : p + begin; };
  in.target = shift(in.target);
  in.token_weight = shift(in.token_weight);
  in.entropy_weight = shift(in.entropy_weight);
  in.old_logp = shift(in.old_logp);
  in.advantage = shift(in.advantage);
  in.ref_logp = shift(in.ref_logp);
  return in;
}

inline RowOutputs ShiftRows(RowOutputs out, int64_t begin) {
  auto shift = [begin](auto* p) { return p == nullptr ? p : p + begin; };
  out.loss = shift(out.loss);
  out.z_loss = shift(out.z_loss);
  out.logprob = shift(out.logprob);
  out.entropy = shift(out.entropy);
  out.argmax = shift(out.argmax);
  out.ratio = shift(out.ratio);
  out.log_ratio = shift(out.log_ratio);
  out.kl = shift(out.kl);
  out.policy_flags = shift(out.policy_flags);
  return out;
}

// Online-softmax state of one row over the columns seen so far. sez is
// sum_j exp(z_j - m) (z_j - m): kept relative to the running max so that a
// peaked row's entropy and loss come out without cancellation.
struct RowState {
  float m;
  float s;
  float sez;
  float sum_z;
  float zy;
  float amax_value;
  int32_t amax_index;
  int32_t pad;
};
static_assert(sizeof(RowState) == 32, "RowState is copied as 32 bytes");

// What the gradient pass needs per row, from the finished state.
struct RowGrad {
  float m;
  float lse;
  float mean_shift;    // sum_j p_j (z_j - m)
  float logprob;       // z_y - LSE (0 for ignored tokens)
  float coef_loss;     // grad_scale * a_t
  float coef_entropy;  // grad_scale * e_t
  int32_t target;
  int32_t pad;
};
static_assert(sizeof(RowGrad) == 32, "RowGrad is copied as 32 bytes");

}  // namespace flce::cuda

#endif  // FLCE_KERNELS_CUDA_BASE_ROW_TYPES_H_
