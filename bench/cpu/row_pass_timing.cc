#include "bench/cpu/row_pass_timing.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <random>
#include <vector>

#include "kernels/cpu/row_pass.h"
#include "kernels/cpu/thread_pool.h"

namespace flce::bench {

double TimeRowPass(int64_t num_tokens, int64_t vocab_size, int64_t chunk_tokens, int threads,
                   float softcap) {
  static std::unique_ptr<cpu::ThreadPool> pool;
  if (pool == nullptr || pool->threads() != threads) {
    pool = std::make_unique<cpu::ThreadPool>(threads);
  }
  const int64_t V = vocab_size;
  const int64_t C = std::min(chunk_tokens, num_tokens);
  std::vector<float> source(C * V);
  std::mt19937_64 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& v : source) v = normal(rng);
  std::vector<float> logits(C * V);
  std::vector<float> scratch(threads * cpu::kRowScratchPerVocab * V);
  cpu::RowPassParams params;
  params.vocab_size = V;
  params.options.softcap = softcap;

  double ms = 0.0;
  for (int64_t start = 0; start < num_tokens; start += C) {
    const int64_t M = std::min(C, num_tokens - start);
    std::copy(source.begin(), source.begin() + M * V, logits.begin());  // untimed
    const auto t0 = std::chrono::steady_clock::now();
    pool->ParallelFor(M, 1, [&](int thread, int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        cpu::ProcessRow(params, logits.data() + i * V, scratch.data() + thread * cpu::kRowScratchPerVocab * V,
                        static_cast<int32_t>(i % V), 1.0 / num_tokens, 0.0, true);
      }
    });
    ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  }
  return ms;
}

}  // namespace flce::bench
