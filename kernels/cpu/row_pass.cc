#include "kernels/cpu/row_pass.h"

#include <cmath>

#include "kernels/cpu/fast_exp.h"

namespace flce::cpu {
namespace {

// Reductions run over kLanes independent accumulators, so the compiler can
// vectorise them without reassociating anything: the order is fixed by the
// code, and the result does not depend on the machine's vector width.
constexpr int kLanes = 8;

// z = (r + b) capped and tempered, in place; with a softcap, cap_grad gets
// du/dr = sech^2(r / c) for every entry.
void ToZ(const RowPassParams& params, float* row, float* cap_grad) {
  const int64_t V = params.vocab_size;
  if (params.bias != nullptr) {
    for (int64_t j = 0; j < V; ++j) row[j] += params.bias[j];
  }
  const float cap = params.options.softcap;
  if (cap > 0.0f) {
    const float inv_cap = 1.0f / cap;
    // sech^2 comes from the uncapped logit, not as 1 - (u/c)^2: where tanh
    // rounds to +-1 in fp32 that would cancel to noise, and in a confident
    // row those entries carry most of a small gradient.
    for (int64_t j = 0; j < V; ++j) row[j] = cap * FastTanh(row[j] * inv_cap, &cap_grad[j]);
  }
  const float tau = params.options.temperature;
  if (tau != 1.0f) {
    for (int64_t j = 0; j < V; ++j) row[j] = row[j] / tau;
  }
}

float RowMax(const float* row, int64_t V) {
  float lanes[kLanes];
  for (int k = 0; k < kLanes; ++k) lanes[k] = row[0];
  int64_t j = 0;
  for (; j + kLanes <= V; j += kLanes) {
    for (int k = 0; k < kLanes; ++k) lanes[k] = row[j + k] > lanes[k] ? row[j + k] : lanes[k];
  }
  float m = lanes[0];
  for (int k = 1; k < kLanes; ++k) m = lanes[k] > m ? lanes[k] : m;
  for (; j < V; ++j) m = row[j] > m ? row[j] : m;
  return m;
}

// Over the row: q_j = exp(z_j - m) into q; returns sum_j q_j, sum_j q_j (z_j - m)
// and sum_j z_j. Float lanes over blocks of kBlock elements keep the loop
// vector-wide; each block's lanes then go into double, so no float sum ever
// runs over more than kBlock / kLanes terms.
constexpr int64_t kBlock = 256;

struct ExpSums {
  double q = 0.0;
  double qz = 0.0;
  double z = 0.0;
};

ExpSums ExpShifted(const float* row, float m, int64_t V, float* q) {
  ExpSums sums;
  int64_t j = 0;
  for (; j + kBlock <= V; j += kBlock) {
    float lanes_q[kLanes] = {};
    float lanes_qz[kLanes] = {};
    float lanes_z[kLanes] = {};
    for (int64_t b = j; b < j + kBlock; b += kLanes) {
      for (int k = 0; k < kLanes; ++k) {
        const float z = row[b + k];
        const float shifted = z - m;
        const float e = FastExp(shifted);
        q[b + k] = e;
        lanes_q[k] += e;
        lanes_qz[k] += e * shifted;
        lanes_z[k] += z;
      }
    }
    for (int k = 0; k < kLanes; ++k) {
      sums.q += lanes_q[k];
      sums.qz += lanes_qz[k];
      sums.z += lanes_z[k];
    }
  }
  for (; j < V; ++j) {
    const float shifted = row[j] - m;
    q[j] = FastExp(shifted);
    sums.q += q[j];
    sums.qz += q[j] * shifted;
    sums.z += row[j];
  }
  return sums;
}

}  // namespace

// x86-64: an AVX2 copy beside the baseline one, chosen at load time (no
// FMA in either, so both round alike). Not under ThreadSanitizer: its
// instrumented ifunc resolver runs during relocation, before the sanitizer's
// runtime is up, and the process dies before main.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(__SANITIZE_THREAD__)
__attribute__((target_clones("avx2", "default")))
#endif
RowStats ProcessRow(const RowPassParams& params, float* row, float* scratch, int32_t target,
                    double token_weight, double entropy_weight, bool want_dr,
                    const PolicyRow* policy) {
  const int64_t V = params.vocab_size;
  const LossOptions& o = params.options;
  const double eps = o.label_smoothing;
  const double s = o.z_loss_scale;
  float* cap_grad = scratch + V;
  ToZ(params, row, cap_grad);

  const float m = RowMax(row, V);
  int64_t argmax = 0;
  while (row[argmax] != m) ++argmax;  // the first maximum: ties go low
  const ExpSums sums = ExpShifted(row, m, V, scratch);
  const double sum_q = sums.q;
  const double sum_qz = sums.qz;
  const double sum_z = sums.z;
  // sum_q = 1 + rest (the max contributes exp(0) = 1): log1p keeps the small
  // rest exact, which is all that separates p_y from 1 in a confident row.
  const double log_sum = std::log1p(sum_q - 1.0);
  const double lse = m + log_sum;
  const double inv_sum = 1.0 / sum_q;
  const double mean_shifted_z = sum_qz * inv_sum;  // sum_j p_j (z_j - m)

  RowStats stats;
  stats.lse = lse;
  stats.entropy = log_sum - mean_shifted_z;
  const bool valid = target >= 0;
  double logprob = 0.0;
  if (valid) {
    logprob = (static_cast<double>(row[target]) - m) - log_sum;
    stats.logprob = logprob;
    stats.loss = -(1.0 - eps) * logprob + eps * (lse - sum_z / V) + s * lse * lse;
    stats.correct = argmax == target;
  }
  if (params.policy != nullptr) {
    // With eps = s = 0, l_t = -logprob: weighing its gradient by
    // -w_t dL_t/dlogp_t gives dL_t/dz.
    token_weight = 0.0;
    stats.loss = 0.0;
    if (valid && policy->weight != 0.0) {
      stats.policy = EvaluatePolicyToken(*params.policy, logprob, policy->old_logp,
                                         policy->advantage, policy->ref_logp);
      stats.loss = stats.policy.loss;
      token_weight = -policy->weight * stats.policy.dloss_dlogp;
    }
  }
  if (!want_dr) return stats;

  const double gscale = o.grad_scale;
  const double a = gscale * token_weight;
  const double e = gscale * entropy_weight;
  if (a == 0.0 && e == 0.0) {
    for (int64_t j = 0; j < V; ++j) row[j] = 0.0f;
    return stats;
  }
  const float z_target = valid ? row[target] : 0.0f;  // overwritten below
  // dr_j = [a (p_j (1 + 2 s LSE) - eps/V) - e p_j ((z_j - m) - mean)] / tau * cap'.
  const float pa = static_cast<float>(inv_sum * a * (1.0 + 2.0 * s * lse));
  const float pe = static_cast<float>(inv_sum * e);
  const float shift = static_cast<float>(a * eps / V);
  const float mean = static_cast<float>(mean_shifted_z);
  const float inv_tau = 1.0f / o.temperature;
  const float cap = o.softcap;
  if (cap > 0.0f) {
    for (int64_t j = 0; j < V; ++j) {
      const float q = scratch[j];
      const float dz = q * pa - shift - q * pe * ((row[j] - m) - mean);
      row[j] = dz * inv_tau * cap_grad[j];
    }
  } else {
    for (int64_t j = 0; j < V; ++j) {
      const float q = scratch[j];
      row[j] = (q * pa - shift - q * pe * ((row[j] - m) - mean)) * inv_tau;
    }
  }
  if (valid) {
    // The target's (1 - eps) term, with p_y - 1 = expm1(logprob) so that a
    // confident row keeps its small gradient instead of rounding it to 0.
    const double p_y = std::exp(logprob);
    const double z_y_shifted = static_cast<double>(z_target) - m;
    const double dloss = std::expm1(logprob) + 2.0 * s * lse * p_y + eps - eps / V;
    const double dentropy = -p_y * (z_y_shifted - mean_shifted_z);
    double dr = (a * dloss + e * dentropy) / o.temperature;
    if (cap > 0.0f) dr *= cap_grad[target];
    row[target] = static_cast<float>(dr);
  }
  return stats;
}

}  // namespace flce::cpu
