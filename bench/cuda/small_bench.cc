// flce_small_bench: small and odd problems through the engine API, the way
// the server drives the CUDA plugin (head resident, hidden rows from host
// memory, grad_input back through the sink, grad_W into a gradient buffer):
// BT in {1, 2048, 6144} x H in {512, 896} x V in {30011, 151937}, bf16, 5% of
// targets ignored, default strategy. At these sizes the fixed costs (launches,
// workspace carving, host synchronisation) are a large part of each call, so
// this is where a change to them shows. It uses only kernels/engine.h and
// LoadCudaEngine, so the same source builds against an older tree to time
// that tree's plugin in the same GPU session.
//
// --forward times calls without a backward instead (the loss and the
// log-probs only: a trainer's log-prob call, a preference objective's first
// pass).
//
// Usage:
//   flce_small_bench --plugin=build/kernels/cuda/libflce_cuda.so --runs=21 --out=small.json
//   flce_small_bench --plugin=... --shapes=1x896x151937,4x896x151937   (BTxHxV: these instead)
//   flce_small_bench --plugin=... --forward --shapes=65535x1024x176245
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "kernels/engine.h"
#include "kernels/engine_factory.h"
#include "nlohmann/json.hpp"

namespace {

using flce::DType;

struct Flags {
  std::string plugin;
  std::string out;
  std::string label = "this build";
  int runs = 21;
  bool forward = false;
  std::vector<std::string> shapes;  // BTxHxV; empty: the twelve above
};

struct Shape {
  int64_t bt, h, v;
};

// The shapes to time, grouped by head (V, H) in order of first appearance.
bool ShapesToTime(const Flags& f, std::vector<Shape>* out) {
  if (f.shapes.empty()) {
    for (int64_t v : {30011, 151937}) {
      for (int64_t h : {512, 896}) {
        for (int64_t bt : {1, 2048, 6144}) out->push_back({bt, h, v});
      }
    }
    return true;
  }
  std::vector<Shape> given;
  for (const std::string& name : f.shapes) {
    long long bt = 0, h = 0, v = 0;
    if (std::sscanf(name.c_str(), "%lldx%lldx%lld", &bt, &h, &v) != 3 || bt < 1 || h < 1 || v < 1) {
      std::fprintf(stderr, "flce_small_bench: shape %s is not BTxHxV\n", name.c_str());
      return false;
    }
    given.push_back({bt, h, v});
  }
  for (size_t i = 0; i < given.size(); ++i) {
    bool seen = false;
    for (size_t j = 0; j < i; ++j) seen |= given[j].h == given[i].h && given[j].v == given[i].v;
    if (seen) continue;
    for (const Shape& s : given) {
      if (s.h == given[i].h && s.v == given[i].v) out->push_back(s);
    }
  }
  return true;
}

bool Parse(int argc, char** argv, Flags* f) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&](const char* name) -> const char* {
      const std::string prefix = std::string("--") + name + "=";
      return arg.rfind(prefix, 0) == 0 ? argv[i] + prefix.size() : nullptr;
    };
    if (const char* v = value("plugin")) {
      f->plugin = v;
    } else if (const char* v = value("out")) {
      f->out = v;
    } else if (const char* v = value("label")) {
      f->label = v;
    } else if (const char* v = value("runs")) {
      f->runs = std::max(1, std::atoi(v));
    } else if (arg == "--forward") {
      f->forward = true;
    } else if (const char* v = value("shapes")) {
      f->shapes = absl::StrSplit(v, ',', absl::SkipEmpty());
    } else {
      std::fprintf(stderr, "flce_small_bench: unknown flag %s\n", argv[i]);
      return false;
    }
  }
  return true;
}

// bf16 bits of x (round to nearest even).
uint16_t ToBf16(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  bits += 0x7fff + ((bits >> 16) & 1);
  return static_cast<uint16_t>(bits >> 16);
}

std::string RandomBf16(int64_t n, float scale, std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.0f, scale);
  std::string bytes(static_cast<size_t>(n) * 2, '\0');
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t b = ToBf16(normal(rng));
    std::memcpy(&bytes[static_cast<size_t>(i) * 2], &b, 2);
  }
  return bytes;
}

// Milliseconds of one call (start, every row in one AddHidden, finish).
double TimeCall(flce::Engine& engine, const std::shared_ptr<const flce::Head>& head,
                const flce::ComputeSpec& spec, const std::string& hidden, bool* ok) {
  const auto start = std::chrono::steady_clock::now();
  auto call = engine.StartCompute(head, spec, [](int64_t, int64_t, std::string) {});
  absl::Status st = call.ok() ? (*call)->AddHidden(0, spec.num_tokens, hidden.data())
                              : call.status();
  if (st.ok()) st = (*call)->Finish().status();
  const auto end = std::chrono::steady_clock::now();
  if (!st.ok()) {
    std::fprintf(stderr, "call failed: %s\n", st.ToString().c_str());
    *ok = false;
  }
  return std::chrono::duration<double, std::milli>(end - start).count();
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  if (!Parse(argc, argv, &flags)) return 2;
  flce::EngineConfig config;
  auto engine = flce::LoadCudaEngine(config, flags.plugin);
  if (!engine.ok()) {
    std::fprintf(stderr, "flce_small_bench: %s\n", engine.status().ToString().c_str());
    return 1;
  }
  std::mt19937_64 rng(12345);
  nlohmann::json results = nlohmann::json::array();
  bool ok = true;
  std::vector<Shape> shapes;
  if (!ShapesToTime(flags, &shapes)) return 2;
  for (size_t first = 0; first < shapes.size();) {
    const int64_t v = shapes[first].v, h = shapes[first].h;
    size_t end = first;
    while (end < shapes.size() && shapes[end].v == v && shapes[end].h == h) ++end;
    flce::HeadSpec hs{v, h, DType::kBF16, false};
    auto builder = (*engine)->BeginHead(hs);
    if (!builder.ok()) return 1;
    const std::string weight = RandomBf16(v * h, 0.02f, rng);
    if (!(*builder)->WriteWeight(0, weight.data(), static_cast<int64_t>(weight.size())).ok()) {
      return 1;
    }
    auto head = (*builder)->Finish();
    auto grad = (*engine)->NewGradBuffer(hs);
    if (!head.ok() || !grad.ok()) return 1;
    for (; first < end; ++first) {
      const int64_t bt = shapes[first].bt;
      flce::ComputeSpec spec;
      spec.num_tokens = bt;
      spec.hidden_dtype = DType::kBF16;
      spec.outputs.grad_input = !flags.forward;
      spec.outputs.logprob = flags.forward;
      spec.grad_out = flags.forward ? nullptr : grad->get();
      std::uniform_int_distribution<int32_t> target(0, static_cast<int32_t>(v - 1));
      std::uniform_real_distribution<float> u(0.0f, 1.0f);
      for (int64_t t = 0; t < bt; ++t) spec.targets.push_back(u(rng) < 0.05f ? -100 : target(rng));
      const std::string hidden = RandomBf16(bt * h, 1.0f, rng);
      std::vector<double> ms;
      for (int r = 0; r < flags.runs + 2; ++r) {
        const double t = TimeCall(**engine, *head, spec, hidden, &ok);
        if (r >= 2) ms.push_back(t);  // two warm-up calls
      }
      std::sort(ms.begin(), ms.end());
      const double median = ms[ms.size() / 2];
      std::printf("  BT=%5lld H=%4lld V=%6lld  median %8.3f ms  (min %.3f, %d runs)\n",
                  static_cast<long long>(bt), static_cast<long long>(h), static_cast<long long>(v),
                  median, ms.front(), flags.runs);
      results.push_back({{"BT", bt},
                         {"H", h},
                         {"V", v},
                         {"forward_only", flags.forward},
                         {"median_ms", median},
                         {"min_ms", ms.front()},
                         {"runs", flags.runs}});
    }
  }
  if (!flags.out.empty()) {
    nlohmann::json doc = {{"label", flags.label},
                          {"engine", (*engine)->info().name},
                          {"results", results}};
    std::ofstream(flags.out) << doc.dump(1) << "\n";
  }
  return ok ? 0 : 1;
}
