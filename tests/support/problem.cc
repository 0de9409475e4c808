#include "tests/support/problem.h"

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <random>

namespace flce::test {
namespace {

std::string ToBytes(DType dtype, const std::vector<float>& values) {
  std::string bytes(values.size() * DTypeSize(dtype), '\0');
  if (values.empty()) return bytes;  // data() may be null
  FromFloat(dtype, values.data(), bytes.data(), static_cast<int64_t>(values.size()));
  return bytes;
}

// Argmax of row t's logits in float64 on the rounded values; ties low.
int32_t ArgmaxLogit(const Problem& p, const std::vector<float>& hidden_as_head, int64_t t) {
  const int64_t V = p.spec.vocab_size;
  const int64_t H = p.spec.hidden_size;
  double best = -std::numeric_limits<double>::infinity();
  int32_t best_j = 0;
  for (int64_t j = 0; j < V; ++j) {
    double r = p.bias.empty() ? 0.0 : p.bias[j];
    for (int64_t k = 0; k < H; ++k) {
      r += static_cast<double>(p.weight[j * H + k]) * hidden_as_head[t * H + k];
    }
    if (r > best) {
      best = r;
      best_j = static_cast<int32_t>(j);
    }
  }
  return best_j;
}

}  // namespace

uint64_t ForcedSeed() {
  static const uint64_t forced = [] {
    const char* text = std::getenv("FLCE_TEST_SEED");
    return text != nullptr ? std::strtoull(text, nullptr, 10) : 0ull;
  }();
  return forced;
}

uint64_t FreshSeed() {
  static std::atomic<uint64_t> counter{0};
  static const uint64_t base = [] {
    std::random_device device;
    return (static_cast<uint64_t>(device()) << 32) ^ device();
  }();
  return base + 0x9e3779b97f4a7c15ull * (counter.fetch_add(1) + 1);
}

std::vector<float> RandomFloats(int64_t n, float lo, float hi, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> out(n);
  for (float& v : out) v = dist(rng);
  return out;
}

Problem MakeProblem(const ProblemSpec& spec) {
  Problem p;
  p.spec = spec;
  p.seed = spec.seed != 0 ? spec.seed : ForcedSeed();
  if (p.seed == 0) p.seed = FreshSeed();
  std::mt19937_64 rng(p.seed);
  const int64_t V = spec.vocab_size;
  const int64_t H = spec.hidden_size;
  const int64_t BT = spec.num_tokens;

  std::normal_distribution<double> normal(0.0, 1.0);
  const double w_std = spec.weight_scale / std::sqrt(static_cast<double>(H));
  p.weight.resize(V * H);
  for (float& w : p.weight) w = static_cast<float>(w_std * normal(rng));
  RoundTo(spec.head_dtype, p.weight.data(), V * H);
  if (spec.has_bias) {
    p.bias.resize(V);
    for (float& b : p.bias) b = static_cast<float>(0.5 * normal(rng));
    RoundTo(spec.head_dtype, p.bias.data(), V);
  }
  p.hidden.resize(BT * H);
  for (float& h : p.hidden) h = static_cast<float>(normal(rng));
  RoundTo(spec.hidden_dtype, p.hidden.data(), BT * H);

  std::vector<float> hidden_as_head = p.hidden;
  RoundTo(spec.head_dtype, hidden_as_head.data(), BT * H);
  std::uniform_int_distribution<int32_t> any_target(0, static_cast<int32_t>(V - 1));
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  p.targets.resize(BT);
  for (int64_t t = 0; t < BT; ++t) {
    p.targets[t] = spec.targets_at_argmax ? ArgmaxLogit(p, hidden_as_head, t) : any_target(rng);
  }
  for (int64_t t = 0; t < BT; ++t) {
    if (unit(rng) < spec.ignore_fraction) p.targets[t] = spec.ignore_index;
  }

  p.weight_bytes = ToBytes(spec.head_dtype, p.weight);
  p.bias_bytes = ToBytes(spec.head_dtype, p.bias);
  p.hidden_bytes = ToBytes(spec.hidden_dtype, p.hidden);
  return p;
}

HeadSpec HeadSpecOf(const Problem& problem) {
  HeadSpec head;
  head.vocab_size = problem.spec.vocab_size;
  head.hidden_size = problem.spec.hidden_size;
  head.dtype = problem.spec.head_dtype;
  head.has_bias = problem.spec.has_bias;
  return head;
}

ReferenceInput MakeReferenceInput(const Problem& problem, const ComputeSpec& spec) {
  ReferenceInput in;
  in.vocab_size = problem.spec.vocab_size;
  in.hidden_size = problem.spec.hidden_size;
  in.num_tokens = problem.spec.num_tokens;
  in.weight.assign(problem.weight.begin(), problem.weight.end());
  in.bias.assign(problem.bias.begin(), problem.bias.end());
  std::vector<float> hidden = problem.hidden;
  RoundTo(problem.spec.head_dtype, hidden.data(), static_cast<int64_t>(hidden.size()));
  in.hidden.assign(hidden.begin(), hidden.end());
  in.targets = problem.targets;
  in.ignore_index = problem.spec.ignore_index;
  in.reduction = spec.reduction;
  in.options = spec.options;
  in.token_weights.assign(spec.token_weights.begin(), spec.token_weights.end());
  in.entropy_weights.assign(spec.entropy_weights.begin(), spec.entropy_weights.end());
  if (spec.policy.has_value()) {
    const PolicyObjective& o = *spec.policy;
    in.has_policy = true;
    in.policy.cispo = o.loss == PolicyLoss::kCispo;
    in.policy.clip_low = o.clip_low;
    in.policy.clip_high = o.clip_high;
    in.policy.dual_clip = o.dual_clip;
    in.policy.kl_coef = o.kl_coef;
    in.policy.kl_k3 = o.kl_estimator == KlEstimator::kK3;
    in.policy.log_ratio_clamp = o.log_ratio_clamp;
    in.policy.old_logp.assign(o.old_logp.begin(), o.old_logp.end());
    in.policy.advantages.assign(o.advantages.begin(), o.advantages.end());
    in.policy.ref_logp.assign(o.ref_logp.begin(), o.ref_logp.end());
    in.policy.weights = o.weights;
  }
  if (spec.preference.has_value()) {
    const PreferenceObjective& o = *spec.preference;
    in.has_preference = true;
    in.preference.loss = static_cast<ReferencePreference::Loss>(static_cast<int>(o.loss));
    in.preference.beta = o.beta;
    in.preference.gamma = o.gamma;
    in.preference.label_smoothing = o.label_smoothing;
    in.preference.normalizer = o.normalizer;
    in.preference.pairs = o.num_pairs;
    in.preference.sequence_of_token = o.sequence_of_token;
    in.preference.ref_logp = o.ref_logp;
  }
  return in;
}

double RelativeError(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return std::numeric_limits<double>::infinity();
  double diff = 0.0;
  double norm_a = 0.0;
  double norm_b = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i])) return std::numeric_limits<double>::infinity();
    diff += (a[i] - b[i]) * (a[i] - b[i]);
    norm_a += a[i] * a[i];
    norm_b += b[i] * b[i];
  }
  if (norm_b == 0.0) return std::sqrt(norm_a);
  return std::sqrt(diff / norm_b);
}

std::vector<double> ToDoubles(const std::vector<float>& values) {
  return std::vector<double>(values.begin(), values.end());
}

std::vector<double> ToDoubles(const std::vector<uint8_t>& values) {
  return std::vector<double>(values.begin(), values.end());
}

}  // namespace flce::test
