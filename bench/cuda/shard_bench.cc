// flce_shard_bench: a head split by vocabulary (--gpus) at the seed shape
// (BT 65535 x H 1024 x V 176245, bf16), through the engine API as the server
// drives it (hidden rows from host memory, grad_input to the sink, grad_W
// into a gradient buffer), next to the one-GPU engine in the same process:
//   one_gpu          the CUDA engine, default plan
//   one_gpu_split    the CUDA engine, vocab_split (the row kernels the sharded plan uses)
//   two_shards_gpu0  --gpus 0,0: both shards on GPU 0 (device copies): the
//                    sharded plan's cost when one GPU does all the work
//   half_vocab_nccl  one shard holding half the vocabulary behind NCCL (one
//                    rank): the work each GPU of --gpus 2 does, without the
//                    transfer between GPUs
// and with as many GPUs as are visible (--gpus all), when there are two or more.
// Each case: the median over --runs calls of the whole call and of Finish
// alone (AddHidden copies the rows to every shard's GPU first), and the
// bytes each GPU holds for the head and one gradient buffer.
//
// Usage: flce_shard_bench --runs=7 --commit=$(git rev-parse HEAD) --out=shard.json
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "kernels/cuda/engine/cuda_engine.h"
#include "kernels/cuda/sharded/sharded_engine.h"
#include "nlohmann/json.hpp"

namespace {

using flce::DType;
using Clock = std::chrono::steady_clock;

constexpr int64_t kTokens = 65535, kHidden = 1024, kVocab = 176245;

struct Flags {
  std::string out;
  std::string commit = "unknown";
  int runs = 7;
};

// Uniform values in [-scale, scale) as bf16 bits, from a fixed seed.
std::string RandomBf16(int64_t n, float scale, uint64_t seed) {
  std::string bytes(static_cast<size_t>(n) * 2, '\0');
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int64_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    const float u = static_cast<float>(x >> 40) / static_cast<float>(1 << 24);
    const float v = (2.0f * u - 1.0f) * scale;
    uint32_t bits;
    std::memcpy(&bits, &v, 4);
    const uint16_t b = static_cast<uint16_t>((bits + 0x7fff + ((bits >> 16) & 1)) >> 16);
    std::memcpy(&bytes[static_cast<size_t>(i) * 2], &b, 2);
  }
  return bytes;
}

double Ms(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Case {
  std::string name;
  std::vector<int> devices;  // empty: the one-GPU engine
  int64_t vocab = kVocab;
  flce::Strategy strategy = flce::Strategy::kAuto;
};

absl::StatusOr<nlohmann::json> Run(const Case& c, const Flags& flags, const std::string& hidden,
                                   const std::vector<int32_t>& targets) {
  flce::EngineConfig config;
  config.devices = c.devices;
  std::unique_ptr<flce::Engine> engine;
  if (c.devices.empty()) {
    auto e = flce::cuda::CudaEngine::Create(config);
    if (!e.ok()) return e.status();
    engine = std::move(*e);
  } else {
    auto e = flce::cuda::ShardedEngine::Create(config);
    if (!e.ok()) return e.status();
    engine = std::move(*e);
  }
  const flce::HeadSpec hs{c.vocab, kHidden, DType::kBF16, false};
  auto builder = engine->BeginHead(hs);
  if (!builder.ok()) return builder.status();
  const std::string weight = RandomBf16(c.vocab * kHidden, 0.03f, 7);
  if (absl::Status st = (*builder)->WriteWeight(0, weight.data(), weight.size()); !st.ok()) return st;
  auto head = (*builder)->Finish();
  if (!head.ok()) return head.status();
  auto grad = engine->NewGradBuffer(hs);
  if (!grad.ok()) return grad.status();
  flce::ComputeSpec spec;
  spec.num_tokens = kTokens;
  spec.hidden_dtype = DType::kBF16;
  spec.strategy = c.strategy;
  spec.outputs.grad_input = true;
  spec.grad_out = grad->get();
  for (int32_t t : targets) spec.targets.push_back(t < 0 ? -100 : t % static_cast<int32_t>(c.vocab));
  std::vector<double> call_ms, finish_ms;
  std::string strategy;
  for (int r = 0; r < flags.runs + 2; ++r) {
    const auto start = Clock::now();
    auto call = engine->StartCompute(*head, spec, [](int64_t, int64_t, std::string) {});
    if (!call.ok()) return call.status();
    if (absl::Status st = (*call)->AddHidden(0, kTokens, hidden.data()); !st.ok()) return st;
    const auto added = Clock::now();
    auto result = (*call)->Finish();
    if (!result.ok()) return result.status();
    const auto end = Clock::now();
    strategy = result->strategy_used;
    if (r >= 2) {  // two warm-up calls
      call_ms.push_back(Ms(start, end));
      finish_ms.push_back(Ms(added, end));
    }
  }
  const flce::EngineInfo info = engine->info();
  const int gpus = std::max<int>(1, static_cast<int>(c.devices.size()));
  nlohmann::json j = {{"case", c.name},
                      {"engine", info.name},
                      {"vocab", c.vocab},
                      {"strategy_used", strategy},
                      {"call_median_ms", Median(call_ms)},
                      {"finish_median_ms", Median(finish_ms)},
                      {"call_ms", call_ms},
                      {"head_plus_grad_bytes_per_shard",
                       ((*head)->resident_bytes() + (*grad)->bytes()) / gpus},
                      {"workspace_peak_bytes", info.workspace_peak_bytes}};
  std::printf("%-16s %-9s V=%6lld  call %8.2f ms  finish %8.2f ms  head+grad/shard %6.0f MiB  (%s)\n",
              c.name.c_str(), strategy.c_str(), static_cast<long long>(c.vocab),
              Median(call_ms), Median(finish_ms),
              static_cast<double>(j["head_plus_grad_bytes_per_shard"].get<int64_t>()) / (1 << 20),
              info.name.c_str());
  return j;
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--out=", 0) == 0) {
      flags.out = arg.substr(6);
    } else if (arg.rfind("--commit=", 0) == 0) {
      flags.commit = arg.substr(9);
    } else if (arg.rfind("--runs=", 0) == 0) {
      flags.runs = std::max(1, std::atoi(arg.c_str() + 7));
    } else {
      std::fprintf(stderr, "flce_shard_bench: unknown flag %s\n", argv[i]);
      return 2;
    }
  }
  int visible = 0;
  if (cudaGetDeviceCount(&visible) != cudaSuccess || visible < 1) {
    std::fprintf(stderr, "flce_shard_bench: no CUDA device\n");
    return 1;
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  const std::string hidden = RandomBf16(kTokens * kHidden, 1.0f, 11);
  std::vector<int32_t> targets(kTokens);
  uint64_t x = 99;
  for (int64_t t = 0; t < kTokens; ++t) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    targets[t] = (x >> 33) % 20 == 0 ? -1 : static_cast<int32_t>((x >> 33) % kVocab);
  }
  std::vector<Case> cases = {
      {"one_gpu", {}, kVocab, flce::Strategy::kAuto},
      {"one_gpu_split", {}, kVocab, flce::Strategy::kVocabSplit},
      {"two_shards_gpu0", {0, 0}, kVocab, flce::Strategy::kAuto},
      {"half_vocab_nccl", {0}, (kVocab + 1) / 2 / 4 * 4 + 4, flce::Strategy::kAuto},
  };
  if (visible >= 2) {
    std::vector<int> all;
    for (int d = 0; d < visible; ++d) all.push_back(d);
    cases.push_back({"all_gpus", all, kVocab, flce::Strategy::kAuto});
  }
  nlohmann::json results = nlohmann::json::array();
  int rc = 0;
  for (const Case& c : cases) {
    absl::StatusOr<nlohmann::json> r = Run(c, flags, hidden, targets);
    if (!r.ok()) {
      std::fprintf(stderr, "%s: %s\n", c.name.c_str(), r.status().ToString().c_str());
      results.push_back({{"case", c.name}, {"error", r.status().ToString()}});
      rc = 1;
      continue;
    }
    results.push_back(*r);
  }
  if (!flags.out.empty()) {
    nlohmann::json doc = {{"bench", "flce_shard_bench"}, {"gpu", prop.name},
                          {"visible_gpus", visible}, {"commit", flags.commit},
                          {"shape", {{"BT", kTokens}, {"H", kHidden}, {"V", kVocab}}},
                          {"runs", flags.runs}, {"results", results}};
    std::ofstream(flags.out) << doc.dump(1) << "\n";
  }
  return rc;
}
