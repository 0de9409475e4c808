#include "tests/support/reference_f64.h"

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

}  // namespace

ReferenceOutput ComputeReference(const ReferenceInput& in) {
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
  out.grad_input.assign(BT * H, 0.0);
  out.grad_weight.assign(V * H, 0.0);
  out.grad_bias.assign(V, 0.0);
  out.grad_input_abs.assign(BT * H, 0.0);
  out.grad_weight_abs.assign(V * H, 0.0);
  out.grad_bias_abs.assign(V, 0.0);
  for (int64_t t = 0; t < BT; ++t) {
    if (IsValid(in, in.targets[t])) ++out.n_valid;
  }

  std::vector<double> u(V), z(V), p(V);
  for (int64_t t = 0; t < BT; ++t) {
    const double* h = &in.hidden[t * H];
    const int32_t y = in.targets[t];
    const bool valid = IsValid(in, y);
    const double a = TokenWeight(in, t, out.n_valid);
    const double e = in.entropy_weights.empty() ? 0.0 : in.entropy_weights[t];

    for (int64_t j = 0; j < V; ++j) {
      double r = in.bias.empty() ? 0.0 : in.bias[j];
      for (int64_t k = 0; k < H; ++k) r += in.weight[j * H + k] * h[k];
      u[j] = cap > 0.0 ? cap * std::tanh(r / cap) : r;
      z[j] = u[j] / tau;
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
      const double loss = lse - (1.0 - eps) * z[y] - (eps / V) * sum_z + s * lse * lse;
      out.per_token_loss[t] = loss;
      out.logprob[t] = z[y] - lse;
      out.correct[t] = argmax == y ? 1 : 0;
      out.n_correct += out.correct[t];
      out.loss += a * loss;
      out.z_loss += a * s * lse * lse;
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
