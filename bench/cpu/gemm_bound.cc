#include "bench/cpu/gemm_bound.h"

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <random>
#include <vector>

namespace flce::bench {
namespace {

std::vector<float> Random(int64_t n, float scale, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> out(n);
  for (float& v : out) v = normal(rng);
  return out;
}

double Ms(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

}  // namespace

GemmTimes TimeThreeGemms(int64_t num_tokens, int64_t vocab_size, int64_t hidden_size,
                         int64_t chunk_tokens) {
  const int64_t V = vocab_size;
  const int64_t H = hidden_size;
  const int64_t C = std::min(chunk_tokens, num_tokens);
  static std::vector<float> w, x, logits, grad_in, grad_w;
  if (w.size() != static_cast<size_t>(V * H)) {
    w = Random(V * H, 0.04f, 1);
    grad_w.assign(V * H, 0.0f);
  }
  if (x.size() != static_cast<size_t>(num_tokens * H)) x = Random(num_tokens * H, 1.0f, 2);
  logits.resize(C * V);
  grad_in.resize(C * H);

  GemmTimes times;
  for (int64_t start = 0; start < num_tokens; start += C) {
    const int64_t M = std::min(C, num_tokens - start);
    const float* xc = x.data() + start * H;
    auto t0 = std::chrono::steady_clock::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, V, H, 1.0f, xc, H, w.data(), H, 0.0f,
                logits.data(), V);
    times.logits_ms += Ms(t0);
    t0 = std::chrono::steady_clock::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, H, V, 1.0f, logits.data(), V,
                w.data(), H, 0.0f, grad_in.data(), H);
    times.grad_input_ms += Ms(t0);
    t0 = std::chrono::steady_clock::now();
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, V, H, M, 1e-6f, logits.data(), V, xc, H,
                1.0f, grad_w.data(), H);
    times.grad_weight_ms += Ms(t0);
  }
  return times;
}

}  // namespace flce::bench
