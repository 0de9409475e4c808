// What the server does per received or sent byte of a Compute call besides
// moving it: HiddenFingerprint over every hidden row (request-id reuse) and
// FirstNonFinite over hidden (bad input) and grad_input (overflow). Sized as
// the first bench shape's step: 65535 rows of H = 1024 bf16, 128 MiB.
//
//   build/bench/server/flce_host_bench --benchmark_out=host.json
#include <cstdint>
#include <random>
#include <vector>

#include "benchmark/benchmark.h"
#include "core/dtype.h"
#include "server/validate/request_fingerprint.h"

namespace {

constexpr int64_t kRows = 65535;
constexpr int64_t kHidden = 1024;

const std::vector<uint16_t>& Bf16Rows() {
  static const std::vector<uint16_t> rows = [] {
    std::vector<uint16_t> v(kRows * kHidden);
    std::mt19937 rng(1);
    std::normal_distribution<float> normal;
    for (auto& x : v) x = flce::FloatToBf16(normal(rng));
    return v;
  }();
  return rows;
}

void SetBytes(benchmark::State& state) {
  state.SetBytesProcessed(state.iterations() * kRows * kHidden * 2);
}

// Per 4 MiB message, as the server sees the rows arrive.
void BM_HiddenFingerprint(benchmark::State& state) {
  const auto& rows = Bf16Rows();
  constexpr int64_t kRowsPerMessage = (4 << 20) / (kHidden * 2);
  for (auto _ : state) {
    uint64_t sum = 0;
    for (int64_t r = 0; r < kRows; r += kRowsPerMessage) {
      const int64_t n = std::min(kRowsPerMessage, kRows - r);
      sum += flce::server::HiddenFingerprint(rows.data() + r * kHidden, n, kHidden * 2, r);
    }
    benchmark::DoNotOptimize(sum);
  }
  SetBytes(state);
}
BENCHMARK(BM_HiddenFingerprint)->Unit(benchmark::kMillisecond);

void BM_FirstNonFiniteBf16(benchmark::State& state) {
  const auto& rows = Bf16Rows();
  for (auto _ : state) {
    benchmark::DoNotOptimize(flce::FirstNonFinite(flce::DType::kBF16, rows.data(), kRows * kHidden));
  }
  SetBytes(state);
}
BENCHMARK(BM_FirstNonFiniteBf16)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
