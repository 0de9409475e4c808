// CUDA-engine checks beyond the shared conformance suite (tests/engine):
// every plan on a seed-like vocabulary against the float64 reference, padded
// columns never winning, the workspace bound, refusals, bitwise determinism,
// streamed grad_input, the sticky-error path and the plugin entry point.
// Every test skips with the reason when there is no CUDA device.
#include "kernels/cuda/engine/cuda_engine.h"

#include <cuda_runtime.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/base/policy.h"
#include "kernels/cuda/base/sm90_support.h"
#include "kernels/cuda/plans/chunk_schedule.h"
#include "kernels/cuda/plans/plans.h"
#include "kernels/engine_factory.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/support/engine_harness.h"
#include "tests/support/problem.h"
#include "tests/support/reference_f64.h"

namespace flce::test {
namespace {

using cuda::CudaEngine;

struct Errors {
  double loss, per_token, grad_input, grad_w, grad_b;
};

Errors Compare(const EngineRun& run, const ReferenceOutput& ref) {
  Errors e;
  e.loss = RelativeError({run.result.loss}, {ref.loss});
  e.per_token = RelativeError(ToDoubles(run.result.per_token_loss), ref.per_token_loss);
  e.grad_input = RelativeError(run.grad_input, ref.grad_input);
  e.grad_w = RelativeError(run.grad_weight, ref.grad_weight);
  e.grad_b = run.grad_bias.empty() ? 0.0 : RelativeError(run.grad_bias, ref.grad_bias);
  return e;
}

// MATH.md's tolerances against float64 for 16-bit heads: loss and per-token
// loss 1e-4, every gradient 5e-3 (fp32 heads are held to tighter ones).
struct Tolerances {
  double loss = 1e-4;
  double grad = 5e-3;
};

// Loss, per-token loss and every gradient of a run within `tol`.
void ExpectWithin(const Errors& e, const Tolerances& tol = {}) {
  EXPECT_LE(e.loss, tol.loss);
  EXPECT_LE(e.per_token, tol.loss);
  EXPECT_LE(e.grad_input, tol.grad);
  EXPECT_LE(e.grad_w, tol.grad);
  EXPECT_LE(e.grad_b, tol.grad);
}

// The chunked plan's spec for a whole problem, chunks of `chunk_tokens` rows,
// for tests that drive StartCompute themselves.
ComputeSpec ChunkedSpecFor(const Problem& problem, int64_t chunk_tokens) {
  ComputeSpec spec = AllOutputsSpec(Strategy::kChunked);
  spec.num_tokens = problem.spec.num_tokens;
  spec.hidden_dtype = problem.spec.hidden_dtype;
  spec.targets = problem.targets;
  spec.chunk_tokens = chunk_tokens;
  return spec;
}

// A bf16 head and bf16 hidden states of the given shape, fresh random data.
Problem Bf16Problem(int64_t vocab, int64_t hidden, int64_t tokens) {
  ProblemSpec ps;
  ps.vocab_size = vocab;
  ps.hidden_size = hidden;
  ps.num_tokens = tokens;
  ps.head_dtype = DType::kBF16;
  ps.hidden_dtype = DType::kBF16;
  return MakeProblem(ps);
}

// The chunked plan's call without entropy or accuracy (a trainer's usual
// call: the one the ping-pong logits kernels serve).
ComputeSpec LeanChunkedSpec() {
  ComputeSpec spec = AllOutputsSpec(Strategy::kChunked);
  spec.outputs.entropy = false;
  spec.outputs.accuracy = false;
  return spec;
}

constexpr Strategy kAllStrategies[] = {Strategy::kChunked, Strategy::kVocabSplit,
                                       Strategy::kFuseMN,  Strategy::kSeparate,
                                       Strategy::kNaive,   Strategy::kAuto};

// The seed shape's vocabulary (176245, odd: padded to 176256 inside) at a
// reduced BT and H, bf16, every plan against one float64 reference.
TEST(CudaEngineTest, EveryStrategyOnSeedVocabularyMatchesReference) {
  auto engine = MakeEngine();
  SKIP_WITHOUT_GPU(engine);
  ProblemSpec ps;
  ps.vocab_size = 176245;
  ps.hidden_size = 136;  // not a multiple of 64
  ps.num_tokens = 40;
  ps.head_dtype = DType::kBF16;
  ps.hidden_dtype = DType::kBF16;
  ps.has_bias = true;
  Problem problem = MakeProblem(ps);
  ComputeSpec base = AllOutputsSpec(Strategy::kAuto);
  ReferenceOutput ref = ComputeReference(MakeReferenceInput(problem, base));
  for (Strategy strategy : kAllStrategies) {
    SCOPED_TRACE(StrategyName(strategy));
    HarnessOptions options;
    options.rows_per_block = 7;
    auto run = RunProblem(**engine, problem, AllOutputsSpec(strategy), options);
    ASSERT_TRUE(run.ok()) << run.status();
    const Errors e = Compare(*run, ref);
    std::printf(
        "  [%s] V=176245 bf16: loss %.2e per-token %.2e grad_input %.2e grad_W %.2e "
        "grad_b %.2e (seed %llu)\n",
        run->result.strategy_used.c_str(), e.loss, e.per_token, e.grad_input, e.grad_w, e.grad_b,
        static_cast<unsigned long long>(problem.seed));
    ExpectWithin(e);
    EXPECT_EQ(run->result.n_valid, ref.n_valid);
    if (strategy != Strategy::kAuto) EXPECT_EQ(run->result.strategy_used, StrategyName(strategy));
  }
}

// The chunked plan's two row kernels (single-pass cluster, two-pass
// fallback) compute the same function; FLCE_CUDA_ROW_KERNEL flips them.
TEST(CudaEngineTest, ClusterAndTwoPassRowKernelsAgree) {
  auto engine = MakeEngine();
  SKIP_WITHOUT_GPU(engine);
  ProblemSpec ps;
  ps.vocab_size = 100003;  // padded 100096: a cluster of 9 blocks (non-portable size)
  ps.hidden_size = 72;
  ps.num_tokens = 50;
  ps.head_dtype = DType::kBF16;
  ps.hidden_dtype = DType::kBF16;
  ps.has_bias = true;
  Problem problem = MakeProblem(ps);
  ComputeSpec spec = AllOutputsSpec(Strategy::kChunked);
  spec.options.label_smoothing = 0.1f;
  spec.options.softcap = 20.0f;
  spec.entropy_weights = RandomFloats(ps.num_tokens, 0.0f, 0.2f, FreshSeed());
  ReferenceOutput ref = ComputeReference(MakeReferenceInput(problem, spec));
  EngineRun runs[2];
  for (int i = 0; i < 2; ++i) {
    auto run = [&] {
      ScopedEnv row_kernel("FLCE_CUDA_ROW_KERNEL", i == 0 ? "cluster" : "two_pass");
      return RunProblem(**engine, problem, spec, {});
    }();
    ASSERT_TRUE(run.ok()) << run.status();
    runs[i] = *run;
    const Errors e = Compare(*run, ref);
    std::printf("  [%s row kernel] loss %.2e per-token %.2e grad_input %.2e grad_W %.2e\n",
                i == 0 ? "cluster" : "two-pass", e.loss, e.per_token, e.grad_input, e.grad_w);
    ExpectWithin(e);
  }
  // Different reduction trees: fp32 stats differ in the last bits, which can
  // flip a bf16 rounding of a few dlogits.
  EXPECT_LE(RelativeError(runs[0].grad_weight, runs[1].grad_weight), 1e-4);
  EXPECT_LE(RelativeError(ToDoubles(runs[0].result.per_token_loss),
                          ToDoubles(runs[1].result.per_token_loss)),
            1e-5);
}

// FLCE_CUDA_OVERLAP=1 runs each chunk as two halves on two streams; the
// results must be the same function (and bitwise repeatable).
TEST(CudaEngineTest, OverlappedChunksMatchReference) {
  auto engine = MakeEngine();
  SKIP_WITHOUT_GPU(engine);
  ProblemSpec ps;
  ps.vocab_size = 20011;
  ps.hidden_size = 64;
  ps.num_tokens = 700;
  ps.head_dtype = DType::kBF16;
  ps.hidden_dtype = DType::kF32;  // the fp32 grad_input path of both halves
  ps.has_bias = true;
  Problem problem = MakeProblem(ps);
  ComputeSpec spec = AllOutputsSpec(Strategy::kChunked);
  spec.chunk_tokens = 320;
  spec.deterministic = true;
  spec.options.z_loss_scale = 1e-3f;
  ReferenceOutput ref = ComputeReference(MakeReferenceInput(problem, spec));
  ScopedEnv overlap("FLCE_CUDA_OVERLAP", "1");
  HarnessOptions options;
  options.seed = FreshSeed();
  options.rows_per_block = 100;
  auto a = RunProblem(**engine, problem, spec, options);
  auto b = RunProblem(**engine, problem, spec, options);
  ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
  const Errors e = Compare(*a, ref);
  std::printf(
      "  [overlapped halves] loss %.2e per-token %.2e grad_input %.2e grad_W %.2e grad_b %.2e\n",
      e.loss, e.per_token, e.grad_input, e.grad_w, e.grad_b);
  ExpectWithin(e);
  EXPECT_TRUE(a->grad_input == b->grad_input);
  EXPECT_TRUE(a->grad_weight == b->grad_weight);
}

// Peaked rows (W x 10, targets at the argmax, p_y near 1) with every option:
// where fp32 logits and the expm1 form of p_y - 1 matter.
TEST(CudaEngineTest, PeakedRowsWithEveryOption) {
  auto engine = MakeEngine();
  SKIP_WITHOUT_GPU(engine);
  ProblemSpec ps;
  ps.vocab_size = 32003;
  ps.hidden_size = 128;
  ps.num_tokens = 64;
  ps.head_dtype = DType::kBF16;
  ps.hidden_dtype = DType::kBF16;
  ps.weight_scale = 10.0;
  ps.targets_at_argmax = true;
  ps.has_bias = true;
  Problem problem = MakeProblem(ps);
  ComputeSpec base = AllOutputsSpec(Strategy::kAuto);
  base.options.label_smoothing = 0.05f;
  base.options.z_loss_scale = 1e-4f;
  base.options.softcap = 30.0f;
  base.options.temperature = 0.9f;
  base.options.grad_scale = 0.5f;
  base.entropy_weights = RandomFloats(ps.num_tokens, -0.1f, 0.1f, FreshSeed());
  ReferenceOutput ref = ComputeReference(MakeReferenceInput(problem, base));
  for (Strategy strategy : kAllStrategies) {
    SCOPED_TRACE(StrategyName(strategy));
    ComputeSpec spec = base;
    spec.strategy = strategy;
    auto run = RunProblem(**engine, problem, spec, {});
    ASSERT_TRUE(run.ok()) << run.status();
    const Errors e = Compare(*run, ref);
    const double entropy = RelativeError(ToDoubles(run->result.entropy), ref.entropy);
    std::printf(
        "  [%s] peaked, every option: loss %.2e per-token %.2e entropy %.2e "
        "grad_input %.2e grad_W %.2e\n",
        run->result.strategy_used.c_str(), e.loss, e.per_token, entropy, e.grad_input, e.grad_w);
    ExpectWithin(e);
    EXPECT_LE(entropy, 1e-4);
  }
}

// On a Hopper GPU the chunked plan's plain-logits default is the logits-stats
// GEMM (row partials in the epilogue, fp16 exp(z - m_tile)); the cuBLAS
// fp32-logits path (FLCE_CUDA_LOGITS=cublas, and every non-plain request)
// must compute the same function. Odd shapes: V prime (a half-padded last
// tile), H a multiple of 8 but not of 64 (TMA zero-fills the K tail), a
// partial last 128-token tile; normal and peaked rows, bf16 and fp16.
TEST(CudaEngineTest, LogitsStatsAndCublasPathsAgree) {
  auto engine = MakeEngine();
  SKIP_WITHOUT_GPU(engine);
  for (DType dtype : {DType::kBF16, DType::kF16}) {
    for (bool peaked : {false, true}) {
      SCOPED_TRACE(std::string(DTypeName(dtype)) + (peaked ? " peaked" : " normal"));
      ProblemSpec ps;
      ps.vocab_size = 50021;
      ps.hidden_size = 200;
      ps.num_tokens = 333;
      ps.head_dtype = dtype;
      ps.hidden_dtype = dtype;
      ps.weight_scale = peaked ? 10.0 : 1.0;
      ps.targets_at_argmax = peaked;
      Problem problem = MakeProblem(ps);
      ComputeSpec spec = AllOutputsSpec(Strategy::kChunked);
      spec.chunk_tokens = 192;  // two chunks, the second partial
      spec.options.label_smoothing = 0.05f;
      spec.options.z_loss_scale = 1e-4f;
      spec.options.grad_scale = 0.5f;
      spec.entropy_weights = RandomFloats(ps.num_tokens, -0.1f, 0.1f, FreshSeed());
      ReferenceOutput ref = ComputeReference(MakeReferenceInput(problem, spec));
      EngineRun runs[2];
      for (int i = 0; i < 2; ++i) {
        auto run = [&] {
          ScopedEnv logits("FLCE_CUDA_LOGITS", i == 1 ? "cublas" : nullptr);
          return RunProblem(**engine, problem, spec, {});
        }();
        ASSERT_TRUE(run.ok()) << run.status();
        runs[i] = *run;
        const Errors e = Compare(*run, ref);
        const double entropy = RelativeError(ToDoubles(run->result.entropy), ref.entropy);
        const double logprob = RelativeError(ToDoubles(run->result.logprob), ref.logprob);
        std::printf(
            "  [%s %s, %s logits] loss %.2e per-token %.2e logprob %.2e entropy %.2e "
            "grad_input %.2e grad_W %.2e\n",
            DTypeName(dtype), peaked ? "peaked" : "normal", i == 0 ? "default" : "cublas", e.loss,
            e.per_token, logprob, entropy, e.grad_input, e.grad_w);
        ExpectWithin(e);
        EXPECT_LE(logprob, 1e-4);
        EXPECT_LE(entropy, 1e-4);
        EXPECT_LE(std::abs(run->result.n_correct - ref.n_correct), ref.n_correct_uncertain);
      }
      EXPECT_LE(RelativeError(runs[0].grad_weight, runs[1].grad_weight), 5e-3);
    }
  }
}

// Over the ignored rows: the largest max_j z_j - x . W_0 (float64).
double MaxIgnoredRowLead(const Problem& p) {
  const int64_t H = p.spec.hidden_size, V = p.spec.vocab_size;
  double lead = -1e300;
  for (int64_t t = 0; t < p.spec.num_tokens; ++t) {
    if (p.targets[t] >= 0) continue;
    auto logit = [&](int64_t j) {
      double z = 0.0;
      for (int64_t k = 0; k < H; ++k) {
        z += static_cast<double>(p.hidden[t * H + k]) * p.weight[j * H + k];
      }
      return z;
    };
    double z_max = -1e300;
    for (int64_t j = 0; j < V; ++j) z_max = std::max(z_max, logit(j));
    lead = std::max(lead, z_max - logit(0));
  }
  return lead;
}

// The row-scaled backward (kernels/cuda/ops/row_scaled_backward.cuh): a bf16 head
// without label smoothing or entropy weights skips the dlogits pass. Against
// the float64 reference and against the dlogits-pass path
// (FLCE_CUDA_DLOGITS_PASS=1): normal rows with z-loss, grad_scale and ignored
// tokens; peaked rows whose target is the argmax (the row reference is the
// max); and logits ~N(0, 30^2) with random targets, many more than 60 nats
// below the row's max, where the device flag sends each chunk back to the
// dlogits pass. V prime, H not a multiple of 64, a partial last chunk. Each
// case also without accuracy (the GEMM then computes no argmax): per-token
// outputs bitwise those of the run with it, gradients within tolerance; and
// without entropy and accuracy (the statistics taken around the target's
// logit, e not capped): within tolerance, no entropy, bitwise repeatable,
// with either kernel that serves that call, and the same call without the
// backward bitwise equal in its per-token outputs. The logits ~N(0, 30^2)
// with targets at the argmax keep every valid row on the row-scaled path
// while ignored rows lie more than 88 nats above their reference x . W_0,
// where an uncapped exp overflows (0 times inf in the backward GEMMs).
TEST(CudaEngineTest, RowScaledBackwardMatchesReference) {
  auto engine = MakeEngine();
  SKIP_WITHOUT_GPU(engine);
  struct Case {
    const char* name;
    double weight_scale;
    bool at_argmax;
  };
  for (const Case& c : {Case{"normal", 1.0, false}, Case{"peaked at the argmax", 10.0, true},
                        Case{"targets far below the max", 30.0, false},
                        Case{"wide logits, targets at the argmax", 30.0, true}}) {
    SCOPED_TRACE(c.name);
    ProblemSpec ps;
    ps.vocab_size = 20011;
    ps.hidden_size = 136;
    ps.num_tokens = 300;
    ps.head_dtype = DType::kBF16;
    ps.hidden_dtype = DType::kBF16;
    ps.weight_scale = c.weight_scale;
    ps.targets_at_argmax = c.at_argmax;
    Problem problem = MakeProblem(ps);
    ComputeSpec spec = AllOutputsSpec(Strategy::kChunked);
    spec.chunk_tokens = 192;
    spec.options.z_loss_scale = 1e-4f;
    spec.options.grad_scale = 0.5f;
    ReferenceOutput ref = ComputeReference(MakeReferenceInput(problem, spec));
    EngineRun runs[2];
    for (int i = 0; i < 2; ++i) {
      auto run = [&] {
        ScopedEnv dlogits_pass("FLCE_CUDA_DLOGITS_PASS", i == 1 ? "1" : nullptr);
        return RunProblem(**engine, problem, spec, {});
      }();
      ASSERT_TRUE(run.ok()) << run.status();
      runs[i] = *run;
      const Errors e = Compare(*run, ref);
      std::printf("  [%s, %s] loss %.2e per-token %.2e grad_input %.2e grad_W %.2e\n", c.name,
                  i == 0 ? "row-scaled" : "dlogits pass", e.loss, e.per_token, e.grad_input,
                  e.grad_w);
      ExpectWithin(e);
      EXPECT_LE(std::abs(run->result.n_correct - ref.n_correct), ref.n_correct_uncertain);
    }
    EXPECT_LE(RelativeError(runs[0].grad_input, runs[1].grad_input), 5e-3);
    EXPECT_LE(RelativeError(runs[0].grad_weight, runs[1].grad_weight), 5e-3);
    if (cuda::sm90::DeviceIsSm90()) {  // the report names the path each run took
      EXPECT_NE(runs[0].result.kernels.find("rows=row_reference"), std::string::npos)
          << runs[0].result.kernels;
      EXPECT_NE(runs[1].result.kernels.find("rows=tile_finish+dlogits_pass"), std::string::npos)
          << runs[1].result.kernels;
    }

    ComputeSpec no_accuracy = spec;
    no_accuracy.outputs.accuracy = false;
    auto run = RunProblem(**engine, problem, no_accuracy, {});
    ASSERT_TRUE(run.ok()) << run.status();
    ExpectWithin(Compare(*run, ref));
    EXPECT_EQ(run->result.n_correct, 0);
    EXPECT_TRUE(run->result.correct.empty());
    EXPECT_EQ(run->result.per_token_loss, runs[0].result.per_token_loss);
    EXPECT_EQ(run->result.entropy, runs[0].result.entropy);

    ComputeSpec lean = no_accuracy;
    lean.outputs.entropy = false;
    // Every kernel that serves this call: ping-pong tiles of 128 columns
    // (V = 20011 pads to an odd count of them), of 192 (tiles straddling
    // partials; the last one ends past the padded vocabulary) and the
    // cooperative 256.
    for (const char* kernel : {"pingpong128", "pingpong192", "cooperative"}) {
      SCOPED_TRACE(kernel);
      HarnessOptions same_blocks;
      same_blocks.seed = FreshSeed();
      ScopedEnv stats_kernel("FLCE_CUDA_STATS_KERNEL", kernel);
      auto lean_run = RunProblem(**engine, problem, lean, same_blocks);
      auto again = RunProblem(**engine, problem, lean, same_blocks);
      ASSERT_TRUE(lean_run.ok()) << lean_run.status();
      ASSERT_TRUE(again.ok()) << again.status();
      const Errors l = Compare(*lean_run, ref);
      const double logprob = RelativeError(ToDoubles(lean_run->result.logprob), ref.logprob);
      std::printf(
          "  [%s, no entropy or accuracy, %s] loss %.2e per-token %.2e logprob %.2e "
          "grad_input %.2e grad_W %.2e\n",
          c.name, kernel, l.loss, l.per_token, logprob, l.grad_input, l.grad_w);
      ExpectWithin(l);
      EXPECT_LE(logprob, 1e-4);
      if (cuda::sm90::DeviceIsSm90()) {
        EXPECT_NE(lean_run->result.kernels.find(std::string("logits=stats_") + kernel),
                  std::string::npos)
            << lean_run->result.kernels;
      }
      EXPECT_TRUE(lean_run->result.entropy.empty());
      EXPECT_EQ(lean_run->result.entropy_sum, 0.0);
      // The ping-pong halves add into shared partials: still repeatable.
      EXPECT_EQ(lean_run->result.loss, again->result.loss);
      EXPECT_EQ(lean_run->result.per_token_loss, again->result.per_token_loss);
      EXPECT_TRUE(lean_run->grad_input == again->grad_input);
      EXPECT_TRUE(lean_run->grad_weight == again->grad_weight);

      // A forward-only call (a preference objective's first pass, a
      // trainer's log-prob call) takes the same GEMM and finish: its
      // per-token outputs are those of the call with the backward, bit for bit.
      ComputeSpec forward = lean;
      forward.outputs.grad_input = false;
      HarnessOptions no_grad = same_blocks;
      no_grad.with_grad_buffer = false;
      auto forward_run = RunProblem(**engine, problem, forward, no_grad);
      ASSERT_TRUE(forward_run.ok()) << forward_run.status();
      EXPECT_TRUE(forward_run->grad_input.empty());
      EXPECT_LE(RelativeError(ToDoubles(forward_run->result.logprob), ref.logprob), 1e-4);
      EXPECT_EQ(forward_run->result.loss, lean_run->result.loss);
      EXPECT_EQ(forward_run->result.per_token_loss, lean_run->result.per_token_loss);
      EXPECT_EQ(forward_run->result.logprob, lean_run->result.logprob);
    }
    if (c.weight_scale == 30.0 && c.at_argmax) {
      EXPECT_GT(MaxIgnoredRowLead(problem), 88.0) << "the case lost what it is for";
    }
  }
}

// The ping-pong kernels' tiles against the 256-column partials at every place
// the padded vocabulary can end: 192-column tiles repeat their layout every
// 768 columns (four tiles over three partials, the middle two straddling a
// boundary), so Vp mod 768 in {128, ..., 640, 0} puts the last tile at each
// of its phases, among them a tile whose upper part would fall into a
// partial past the row's last (Vp mod 768 = 256 and 512: its sums must stay
// out of the next row's partials). The call without entropy or accuracy (the
// one these kernels serve), ignored tokens included, on each kernel against
// the float64 reference; H off the 64-column k-blocks.
TEST(CudaEngineTest, PingPongTilesAtEveryVocabularyPhase) {
  auto engine = MakeEngine();
  SKIP_WITHOUT_GPU(engine);
  for (int64_t padded : {1664, 1792, 1920, 2048, 2176, 2304}) {
    const Problem problem = Bf16Problem(padded - 5, 72, 160);
    const ComputeSpec spec = LeanChunkedSpec();
    const ReferenceOutput ref = ComputeReference(MakeReferenceInput(problem, spec));
    for (const char* kernel : {"pingpong192", "pingpong128", "cooperative"}) {
      SCOPED_TRACE(std::string(kernel) + ", V " + std::to_string(padded - 5) + ", seed " +
                   std::to_string(problem.seed));
      ScopedEnv stats_kernel("FLCE_CUDA_STATS_KERNEL", kernel);
      auto run = RunProblem(**engine, problem, spec, {});
      ASSERT_TRUE(run.ok()) << run.status();
      ExpectWithin(Compare(*run, ref));
    }
  }
}

// The 192-column ping-pong kernel in CTA pairs sharing each W tile (TMA
// multicast) against the same kernel one CTA per tile: bitwise equal, both
// within tolerance of float64. Odd token-tile counts (the last pair's second
// tile past the chunk), a chunk boundary, H off the 64-column k-blocks, the
// vocabulary ending at several tile phases, and more pairs of tiles than
// clusters (each warpgroup takes several turns).
TEST(CudaEngineTest, PingPongPairsMatchSingleCtasBitwise) {
  auto engine = MakeEngine();
  SKIP_WITHOUT_GPU(engine);
  struct Case {
    int64_t vocab, hidden, tokens, chunk;
  };
  for (const Case& c : {Case{1915, 72, 300, 0}, Case{2299, 136, 700, 384},
                        Case{20011, 264, 1100, 0}, Case{1659, 64, 129, 0}}) {
    const Problem problem = Bf16Problem(c.vocab, c.hidden, c.tokens);
    ComputeSpec spec = LeanChunkedSpec();
    if (c.chunk > 0) spec.chunk_tokens = c.chunk;
    const ReferenceOutput ref = ComputeReference(MakeReferenceInput(problem, spec));
    ScopedEnv stats_kernel("FLCE_CUDA_STATS_KERNEL", "pingpong192");
    // All rows in one block, so that the chunks are the plan's: rows streamed
    // in small blocks run chunks of a few tokens, where pairs are not taken.
    HarnessOptions one_block;
    one_block.rows_per_block = 0;
    EngineRun runs[2];
    for (int i = 0; i < 2; ++i) {
      SCOPED_TRACE(::testing::Message()
                   << (i == 0 ? "pairs" : "single CTAs") << ", V " << c.vocab << " H " << c.hidden
                   << " BT " << c.tokens << ", seed " << problem.seed);
      auto run = [&] {
        ScopedEnv pairs("FLCE_CUDA_STATS_PAIRS", i == 1 ? "0" : nullptr);
        return RunProblem(**engine, problem, spec, one_block);
      }();
      ASSERT_TRUE(run.ok()) << run.status();
      ExpectWithin(Compare(*run, ref));
      runs[i] = *run;
    }
    if (cuda::sm90::DeviceIsSm90()) {  // the report says which of the two ran
      EXPECT_NE(runs[0].result.kernels.find("logits=stats_pingpong192_pairs "), std::string::npos)
          << runs[0].result.kernels;
      EXPECT_NE(runs[1].result.kernels.find("logits=stats_pingpong192 "), std::string::npos)
          << runs[1].result.kernels;
    }
    EXPECT_EQ(runs[0].result.loss, runs[1].result.loss);
    EXPECT_EQ(runs[0].result.per_token_loss, runs[1].result.per_token_loss);
    EXPECT_TRUE(runs[0].grad_input == runs[1].grad_input);
    EXPECT_TRUE(runs[0].grad_weight == runs[1].grad_weight);
  }
}

// Which heads and requests the planner sends to the logits-stats GEMM: only
// plain logits on bf16/fp16 heads without bias, H % 8 == 0, on compute
// capability 9.0; everything else keeps the cuBLAS path (and its chunk size).
TEST(CudaEngineTest, PlannerTakesLogitsStatsOnlyWhereSupported) {
  auto engine = MakeEngine();
  SKIP_WITHOUT_GPU(engine);
  int device = 0, major = 0, minor = 0;
  ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device), cudaSuccess);
  const bool hopper = major == 9 && minor == 0;
  const float bias_marker = 0.0f;
  auto plan = [&](DType dtype, int64_t hidden, bool bias, bool plain) {
    cuda::HeadView head;
    head.dtype = dtype;
    head.vocab = 128000;
    head.padded_vocab = 128000;
    head.hidden = hidden;
    head.bias = bias ? &bias_marker : nullptr;
    cuda::PlanRequest req;
    req.strategy = Strategy::kChunked;
    req.num_tokens = 100000;
    req.hidden_dtype = dtype;
    req.plain_logits = plain;
    auto p = cuda::MakePlan(head, req, int64_t{2048} << 20);
    EXPECT_TRUE(p.ok()) << p.status();
    return p.ok() ? *p : cuda::Plan{};
  };
  const cuda::Plan fast = plan(DType::kBF16, 1024, false, true);
  EXPECT_EQ(fast.tile_stats, hopper);
  EXPECT_EQ(plan(DType::kF16, 1024, false, true).tile_stats, hopper);
  const cuda::Plan cublas = plan(DType::kBF16, 1024, false, false);
  EXPECT_FALSE(cublas.tile_stats);
  EXPECT_FALSE(plan(DType::kBF16, 1024, true, true).tile_stats);
  EXPECT_FALSE(plan(DType::kBF16, 1020, false, true).tile_stats);
  EXPECT_FALSE(plan(DType::kF32, 1024, false, true).tile_stats);
  {
    ScopedEnv logits("FLCE_CUDA_LOGITS", "cublas");
    EXPECT_FALSE(plan(DType::kBF16, 1024, false, true).tile_stats);
  }
  {
    // The plans of GPUs before Hopper, forced on this one.
    ScopedEnv generic("FLCE_CUDA_GENERIC", "1");
    EXPECT_FALSE(plan(DType::kBF16, 1024, false, true).tile_stats);
  }
  EXPECT_EQ(plan(DType::kBF16, 1024, false, true).tile_stats, hopper);
  // 2 bytes per logit instead of 4: about twice the tokens per chunk.
  if (hopper) EXPECT_GT(fast.chunk_tokens, cublas.chunk_tokens * 3 / 2);
}

// A bf16 head as the planner sees it.
cuda::HeadView PlannedHead(int64_t vocab, int64_t padded_vocab, int64_t hidden) {
  cuda::HeadView head;
  head.dtype = DType::kBF16;
  head.vocab = vocab;
  head.padded_vocab = padded_vocab;
  head.hidden = hidden;
  return head;
}

// The chunked plan of `req` within `budget` bytes (an empty plan after a
// failed expectation).
cuda::Plan ChunkedPlanOf(const cuda::HeadView& head, cuda::PlanRequest req,
                         int64_t budget = int64_t{2048} << 20) {
  req.strategy = Strategy::kChunked;
  auto p = cuda::MakePlan(head, req, budget);
  EXPECT_TRUE(p.ok()) << p.status();
  return p.ok() ? *p : cuda::Plan{};
}

// Requests of several budget-sized chunks are cut into equal chunks (rounded
// up to ChunkPolicy::kBalancedAlign) rather than full chunks and a short
// remainder; a caller's chunk hint is honoured as given. Host-only: the
// budget allows ChunkPolicy::kMaxTokens here on either logits path.
TEST(ChunkPlanTest, SeveralChunksComeOutEqual) {
  const cuda::HeadView head = PlannedHead(1000, 1024, 64);
  auto chunk_for = [&](int64_t tokens, int64_t hint) {
    cuda::PlanRequest req;
    req.num_tokens = tokens;
    req.hidden_dtype = DType::kBF16;
    req.chunk_tokens = hint;
    return ChunkedPlanOf(head, req).chunk_tokens;
  };
  constexpr int64_t kMax = cuda::ChunkPolicy::kMaxTokens;
  EXPECT_EQ(chunk_for(kMax, 0), kMax);           // one chunk
  EXPECT_EQ(chunk_for(kMax + 100, 0), 4352);     // 2 x 4146 rounded up, not 8192 + 100
  EXPECT_EQ(chunk_for(2 * kMax + 1, 0), 5632);   // 3 x 5462 rounded up
  EXPECT_EQ(chunk_for(3 * kMax - 5, 0), kMax);   // rounding never exceeds the budget
  EXPECT_EQ(chunk_for(kMax + 100, 192), 192);    // the hint as given
  EXPECT_EQ(chunk_for(kMax + 100, 6000), 4352);  // a hint above the balanced size
}

// A call whose hidden arrives over the wire gets edge chunks of
// ChunkPolicy::kWirePacedBytes of hidden (within its token bounds) and the
// budget's chunks between them, unless the caller names a chunk or asks for
// deterministic results (which keep the budget's chunks on every transport).
// Host-only.
TEST(ChunkPlanTest, WirePacedCallsGetSmallEdgeChunks) {
  auto plan_for = [](int64_t hidden, DType dtype, bool paced, int64_t hint) {
    cuda::PlanRequest req;
    req.num_tokens = 32768;
    req.hidden_dtype = dtype;
    req.chunk_tokens = hint;
    req.wire_paced = paced;
    return ChunkedPlanOf(PlannedHead(1000, 1024, hidden), req);
  };
  EXPECT_EQ(plan_for(4096, DType::kBF16, true, 0).edge_tokens, 1024);  // 8 MiB of bf16 rows
  EXPECT_EQ(plan_for(4096, DType::kF32, true, 0).edge_tokens, 512);    // fp32 rows: half
  EXPECT_EQ(plan_for(1024, DType::kBF16, true, 0).edge_tokens, 2048);  // capped in tokens
  EXPECT_EQ(plan_for(32768, DType::kBF16, true, 0).edge_tokens, 256);  // floored in tokens
  const cuda::Plan paced = plan_for(4096, DType::kBF16, true, 0);
  const cuda::Plan regions = plan_for(4096, DType::kBF16, false, 0);
  EXPECT_EQ(regions.edge_tokens, 0);
  EXPECT_GT(regions.chunk_tokens, 2048);                       // regions: the budget's
  EXPECT_EQ(paced.chunk_tokens, regions.chunk_tokens);         // and between the edges too
  const cuda::Plan hinted = plan_for(4096, DType::kBF16, true, 3072);
  EXPECT_EQ(hinted.chunk_tokens, 3072);  // the caller's chunk wins, without edges
  EXPECT_EQ(hinted.edge_tokens, 0);
}

// A wire-paced call streams through three upload/download slots, counted in
// the plan's per-token bytes, so that filling chunk i+2 need not wait for
// chunk i's grad_input to reach the transport; every other call keeps two.
// Host-only.
TEST(ChunkPlanTest, WirePacedCallsStreamThroughThreeSlots) {
  const cuda::HeadView head = PlannedHead(128256, 128256, 4096);
  auto plan_for = [&](bool paced, int64_t hint, bool streaming, int64_t budget) {
    cuda::PlanRequest req;
    req.num_tokens = 32768;
    req.chunk_tokens = hint;
    req.wire_paced = paced;
    req.streaming = streaming;
    return ChunkedPlanOf(head, req, budget);
  };
  const int64_t budget = int64_t{2048} << 20;
  EXPECT_EQ(plan_for(true, 0, true, budget).stream_slots, 3);
  EXPECT_EQ(plan_for(false, 0, true, budget).stream_slots, 2);
  EXPECT_EQ(plan_for(true, 3072, true, budget).stream_slots, 2);  // a caller's chunk
  EXPECT_EQ(plan_for(true, 0, false, budget).stream_slots, 0);
  {
    ScopedEnv two("FLCE_CUDA_WIRE_SLOTS", "2");
    EXPECT_EQ(plan_for(true, 0, true, budget).stream_slots, 2);
  }
  // The third slot's bytes come out of the budget: at a budget that sizes
  // the chunk, the paced call's chunk is the smaller one.
  const int64_t tight = int64_t{512} << 20;
  EXPECT_LT(plan_for(true, 0, true, tight).chunk_tokens,
            plan_for(false, 0, true, tight).chunk_tokens);
}

std::vector<int64_t> ChunkSizes(int64_t chunk, int64_t edge, int64_t n) {
  cuda::Plan plan;
  plan.chunk_tokens = chunk;
  plan.edge_tokens = edge;
  std::vector<int64_t> sizes;
  int64_t begin = 0;
  for (int64_t end : cuda::ChunkEnds(plan, n)) {
    sizes.push_back(end - begin);
    begin = end;
  }
  return sizes;
}

// Edge chunks double towards the plan's chunk and mirror at the end; the
// chunks between them are equal and never above the plan's. Host-only.
TEST(ChunkPlanTest, ScheduleRampsUpAndDown) {
  using V = std::vector<int64_t>;
  // 32768 x 4096 bf16 over the wire: 9 chunks where uniform edge-sized ones were 32.
  EXPECT_EQ(ChunkSizes(6592, 1024, 32768), (V{1024, 2048, 4096, 6144, 6144, 6144, 4096, 2048,
                                               1024}));
  EXPECT_EQ(ChunkSizes(4096, 1024, 8192), (V{1024, 2048, 2048, 2048, 1024}));
  EXPECT_EQ(ChunkSizes(4096, 1024, 2000), (V{1024, 976}));      // too short for a ramp
  EXPECT_EQ(ChunkSizes(4096, 1024, 2048), (V{1024, 1024}));     // the two edges alone
  EXPECT_EQ(ChunkSizes(4096, 1024, 2100), (V{1024, 52, 1024}));
  EXPECT_EQ(ChunkSizes(320, 0, 700), (V{320, 320, 60}));        // no edges: the plan's chunks
  EXPECT_EQ(ChunkSizes(4096, 4096, 9000), (V{4096, 4096, 808}));  // an edge as large: none
  for (int64_t n : {1, 63, 1000, 2047, 5000, 65535, 100003}) {
    for (int64_t edge : {0, 256, 1024, 2048}) {
      SCOPED_TRACE(testing::Message() << "n " << n << " edge " << edge);
      const V sizes = ChunkSizes(5632, edge, n);
      int64_t sum = 0;
      for (int64_t s : sizes) {
        EXPECT_GT(s, 0);
        EXPECT_LE(s, 5632);
        sum += s;
      }
      EXPECT_EQ(sum, n);
      if (edge > 0 && n >= 2 * edge) {
        EXPECT_EQ(sizes.front(), edge);
        EXPECT_EQ(sizes.back(), edge);
      }
    }
  }
}

// A chunk that starts after a gap ends where the schedule's would. Host-only.
TEST(ChunkPlanTest, ChunksAfterAGapEndOnTheSchedule) {
  const std::vector<int64_t> ends = {1024, 3072, 7168, 9216, 10240};
  EXPECT_EQ(cuda::ChunkRowsFrom(ends, 6592, 0), 1024);
  EXPECT_EQ(cuda::ChunkRowsFrom(ends, 6592, 1024), 2048);
  EXPECT_EQ(cuda::ChunkRowsFrom(ends, 6592, 2000), 1072);
  EXPECT_EQ(cuda::ChunkRowsFrom(ends, 6592, 3072), 4096);
  EXPECT_EQ(cuda::ChunkRowsFrom(ends, 2048, 3072), 2048);  // never above the plan's chunk
  EXPECT_EQ(cuda::ChunkRowsFrom(ends, 6592, 10000), 240);
}

// The chunk the engine says it would run a call in is its streamed plan's:
// the budget's, balanced over the call's tokens, the caller's hint as given,
// the same whether the rows come over the wire or not; none for a plan that
// is not cut in token chunks.
TEST(CudaEngineTest, PlannedChunkTokensIsTheStreamedPlansChunk) {
  auto engine = MakeEngine();
  SKIP_WITHOUT_GPU(engine);
  Problem problem = Bf16Problem(1000, 1024, 64);
  auto head = BuildHead(**engine, problem, 2);
  ASSERT_TRUE(head.ok()) << head.status();
  ComputeSpec spec = ChunkedSpecFor(problem, 0);
  spec.num_tokens = 2 * cuda::ChunkPolicy::kMaxTokens + 1;
  EXPECT_EQ((*engine)->PlannedChunkTokens(**head, spec), 5632);  // 3 x 5462 rounded up
  spec.wire_paced = true;
  EXPECT_EQ((*engine)->PlannedChunkTokens(**head, spec), 5632);
  spec.chunk_tokens = 192;
  EXPECT_EQ((*engine)->PlannedChunkTokens(**head, spec), 192);
  spec.chunk_tokens = 0;
  spec.strategy = Strategy::kVocabSplit;
  EXPECT_EQ((*engine)->PlannedChunkTokens(**head, spec), 0);
}

// A call over the wire with a ramped schedule: its grad_input reaches the sink
// in the schedule's chunks when rows come in order, and in any order every
// output matches float64.
TEST(CudaEngineTest, WirePacedScheduleMatchesReference) {
  auto engine = MakeEngine();
  SKIP_WITHOUT_GPU(engine);
  ProblemSpec ps;
  ps.vocab_size = 97;
  ps.hidden_size = 16384;  // 64 KiB fp32 rows: 256-row edges
  ps.num_tokens = 1700;
  ps.head_dtype = DType::kBF16;
  ps.hidden_dtype = DType::kF32;
  ps.has_bias = true;
  Problem problem = MakeProblem(ps);
  ComputeSpec spec = AllOutputsSpec(Strategy::kChunked);
  spec.wire_paced = true;
  ReferenceOutput ref = ComputeReference(MakeReferenceInput(problem, spec));
  HarnessOptions options;
  options.seed = FreshSeed();
  options.rows_per_block = 333;
  auto run = RunProblem(**engine, problem, spec, options);
  ASSERT_TRUE(run.ok()) << run.status();
  const Errors e = Compare(*run, ref);
  std::printf("  [wire-paced] loss %.2e per-token %.2e grad_input %.2e grad_W %.2e grad_b %.2e\n",
              e.loss, e.per_token, e.grad_input, e.grad_w, e.grad_b);
  ExpectWithin(e);

  auto head = BuildHead(**engine, problem, 2);
  ASSERT_TRUE(head.ok()) << head.status();
  ComputeSpec in_order = ChunkedSpecFor(problem, 0);
  in_order.wire_paced = true;
  std::mutex mu;
  std::vector<int64_t> piece_ends;
  auto call = (*engine)->StartCompute(*head, in_order, [&](int64_t at, int64_t rows,
                                                          std::string data) {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_EQ(static_cast<int64_t>(data.size()), rows * ps.hidden_size * 4);
    piece_ends.push_back(at + rows);
  });
  ASSERT_TRUE(call.ok()) << call.status();
  const int64_t row_bytes = ps.hidden_size * 4;
  for (int64_t t = 0; t < ps.num_tokens; t += 333) {
    const int64_t rows = std::min<int64_t>(333, ps.num_tokens - t);
    ASSERT_TRUE((*call)->AddHidden(t, rows, problem.hidden_bytes.data() + t * row_bytes).ok());
  }
  auto finished = (*call)->Finish();
  ASSERT_TRUE(finished.ok()) << finished.status();
  // A streamed call says how long its input waited for a free slot.
  EXPECT_GE(finished->input_wait_ms, 0.0);
  EXPECT_LE(finished->input_wait_ms, finished->engine_ms);
  // 1700 rows, 256-row edges, the plan's chunk 1728: chunks of 256, 512, 164,
  // 512 and 256 rows, each handed over in pieces of 8 MiB (128 rows).
  std::vector<int64_t> expected;
  int64_t begin = 0;
  for (int64_t end : {256, 768, 932, 1444, 1700}) {
    for (int64_t at = begin; at < end; at += 128) {
      expected.push_back(std::min<int64_t>(at + 128, end));
    }
    begin = end;
  }
  EXPECT_EQ(piece_ends, expected);
}

// Every real logit is about -40 (bias), the padded columns' would be 0: if
// padding leaked into the max, sum or argmax, loss and accuracy would be off.
TEST(CudaEngineTest, PaddedColumnsNeverCount) {
  auto engine = MakeEngine();
  SKIP_WITHOUT_GPU(engine);
  ProblemSpec ps;
  ps.vocab_size = 1001;  // padded to 1024
  ps.hidden_size = 40;
  ps.num_tokens = 33;
  ps.head_dtype = DType::kF32;
  ps.hidden_dtype = DType::kF32;
  ps.has_bias = true;
  Problem problem = MakeProblem(ps);
  for (float& b : problem.bias) b -= 40.0f;
  problem.bias_bytes.assign(reinterpret_cast<const char*>(problem.bias.data()),
                            problem.bias.size() * sizeof(float));
  ComputeSpec base = AllOutputsSpec(Strategy::kAuto);
  base.options.label_smoothing = 0.1f;
  ReferenceOutput ref = ComputeReference(MakeReferenceInput(problem, base));
  for (Strategy strategy : kAllStrategies) {
    SCOPED_TRACE(StrategyName(strategy));
    ComputeSpec spec = base;
    spec.strategy = strategy;
    auto run = RunProblem(**engine, problem, spec, {});
    ASSERT_TRUE(run.ok()) << run.status();
    ExpectWithin(Compare(*run, ref), Tolerances{1e-5, 1e-4});  // an fp32 head
    EXPECT_LE(std::abs(run->result.n_correct - ref.n_correct), ref.n_correct_uncertain);
  }
}

// The workspace is sized by the budget and the shape, never by BT.
TEST(CudaEngineTest, WorkspaceDoesNotGrowWithTokens) {
  auto engine = MakeEngine(/*budget_mb=*/64);
  SKIP_WITHOUT_GPU(engine);
  ProblemSpec ps;
  ps.vocab_size = 32000;
  ps.hidden_size = 64;
  ps.head_dtype = DType::kBF16;
  ps.hidden_dtype = DType::kBF16;
  ps.seed = FreshSeed();
  int64_t peaks[2] = {0, 0};
  // Both several chunks at this budget: the second request, four times the
  // tokens, must not need more (a request of a few chunks may take smaller
  // balanced chunks; the peak is over the engine's lifetime).
  int64_t tokens[2] = {12000, 48000};
  for (int i = 0; i < 2; ++i) {
    ps.num_tokens = tokens[i];
    Problem problem = MakeProblem(ps);
    HarnessOptions options;
    options.rows_per_block = 1000;
    options.shuffle_blocks = false;
    ComputeSpec spec = AllOutputsSpec(Strategy::kChunked);
    auto run = RunProblem(**engine, problem, spec, options);
    ASSERT_TRUE(run.ok()) << run.status();
    peaks[i] = (*engine)->info().workspace_peak_bytes;
    std::printf("  BT=%lld: workspace peak %.1f MiB (budget 64 MiB)\n",
                static_cast<long long>(tokens[i]), peaks[i] / 1048576.0);
  }
  EXPECT_GT(peaks[0], 0);
  EXPECT_LE(peaks[1], int64_t{64} << 20);
  EXPECT_EQ(peaks[0], peaks[1]);
}

// naive and separate refuse (never crash) when (BT x V) does not fit, naming
// needed and available bytes; the engine keeps serving afterwards.
TEST(CudaEngineTest, NaiveAndSeparateRefuseWhenTooBig) {
  auto engine = MakeEngine(/*budget_mb=*/32);
  SKIP_WITHOUT_GPU(engine);
  ProblemSpec ps;
  ps.vocab_size = 50000;
  ps.hidden_size = 32;
  ps.num_tokens = 2000;
  ps.head_dtype = DType::kBF16;
  ps.hidden_dtype = DType::kBF16;
  Problem problem = MakeProblem(ps);
  for (Strategy strategy : {Strategy::kNaive, Strategy::kSeparate}) {
    auto run = RunProblem(**engine, problem, AllOutputsSpec(strategy), {});
    ASSERT_FALSE(run.ok());
    EXPECT_EQ(run.status().code(), absl::StatusCode::kResourceExhausted) << run.status();
    EXPECT_NE(run.status().message().find("needs"), std::string::npos) << run.status();
    EXPECT_NE(run.status().message().find("available"), std::string::npos) << run.status();
  }
  EXPECT_TRUE((*engine)->healthy());
  auto run = RunProblem(**engine, problem, AllOutputsSpec(Strategy::kChunked), {});
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->result.strategy_used, "chunked");
}

// Same inputs, same chunking and arrival order: bitwise-identical outputs.
TEST(CudaEngineTest, DeterministicRunsAreBitwiseIdentical) {
  auto engine = MakeEngine();
  SKIP_WITHOUT_GPU(engine);
  ProblemSpec ps;
  ps.vocab_size = 5003;
  ps.hidden_size = 96;
  ps.num_tokens = 300;
  ps.head_dtype = DType::kBF16;
  ps.hidden_dtype = DType::kBF16;
  ps.has_bias = true;
  Problem problem = MakeProblem(ps);
  for (Strategy strategy : kAllStrategies) {
    SCOPED_TRACE(StrategyName(strategy));
    ComputeSpec spec = AllOutputsSpec(strategy);
    spec.deterministic = true;
    spec.chunk_tokens = 128;
    HarnessOptions options;
    options.seed = FreshSeed();
    options.rows_per_block = 50;
    auto a = RunProblem(**engine, problem, spec, options);
    auto b = RunProblem(**engine, problem, spec, options);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(a->result.loss, b->result.loss);
    EXPECT_EQ(a->result.per_token_loss, b->result.per_token_loss);
    EXPECT_TRUE(a->grad_input == b->grad_input);
    EXPECT_TRUE(a->grad_weight == b->grad_weight);
    EXPECT_TRUE(a->grad_bias == b->grad_bias);
    if (strategy == Strategy::kFuseMN) {
      // fuse_mn's atomics have no fixed order: deterministic runs vocab_split.
      EXPECT_EQ(a->result.strategy_used, "vocab_split");
    }
  }
}

// grad_input of early chunks reaches the sink while later rows are still
// coming in.
TEST(CudaEngineTest, ChunkedStreamsGradInputBeforeFinish) {
  auto engine = MakeEngine();
  SKIP_WITHOUT_GPU(engine);
  ProblemSpec ps;
  ps.vocab_size = 8192;
  ps.hidden_size = 64;
  ps.num_tokens = 2048;
  ps.head_dtype = DType::kBF16;
  ps.hidden_dtype = DType::kBF16;
  Problem problem = MakeProblem(ps);
  auto head = BuildHead(**engine, problem, 2);
  ASSERT_TRUE(head.ok()) << head.status();
  ComputeSpec spec = ChunkedSpecFor(problem, 256);
  std::atomic<int64_t> delivered{0};
  auto call = (*engine)->StartCompute(*head, spec, [&](int64_t, int64_t rows, std::string data) {
    EXPECT_EQ(static_cast<int64_t>(data.size()), rows * ps.hidden_size * 2);
    delivered += rows;
  });
  ASSERT_TRUE(call.ok()) << call.status();
  const int64_t row_bytes = ps.hidden_size * 2;
  for (int64_t t = 0; t + 256 < ps.num_tokens; t += 256) {
    ASSERT_TRUE((*call)->AddHidden(t, 256, problem.hidden_bytes.data() + t * row_bytes).ok());
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (delivered.load() == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_GT(delivered.load(), 0) << "no grad_input before the last rows arrived";
  const int64_t last = ps.num_tokens - 256;
  ASSERT_TRUE((*call)->AddHidden(last, 256, problem.hidden_bytes.data() + last * row_bytes).ok());
  auto result = (*call)->Finish();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(delivered.load(), ps.num_tokens);
}

// Destroying a call mid-stream cancels it: no sink call after the
// destructor returns, its slots go back to the pool, and the next call on the
// same engine runs normally.
TEST(CudaEngineTest, DestroyingACallMidStreamCancelsIt) {
  auto engine = MakeEngine();
  SKIP_WITHOUT_GPU(engine);
  ProblemSpec ps;
  ps.vocab_size = 4099;
  ps.hidden_size = 64;
  ps.num_tokens = 1024;
  ps.head_dtype = DType::kBF16;
  ps.hidden_dtype = DType::kBF16;
  Problem problem = MakeProblem(ps);
  auto head = BuildHead(**engine, problem, 2);
  ASSERT_TRUE(head.ok()) << head.status();
  ComputeSpec spec = ChunkedSpecFor(problem, 128);
  std::atomic<bool> destroyed{false};
  std::atomic<int> late_calls{0};
  {
    auto call = (*engine)->StartCompute(*head, spec, [&](int64_t, int64_t, std::string) {
      if (destroyed.load()) ++late_calls;
    });
    ASSERT_TRUE(call.ok()) << call.status();
    const int64_t row_bytes = ps.hidden_size * 2;
    for (int64_t t = 0; t < 600; t += 100) {
      ASSERT_TRUE((*call)->AddHidden(t, 100, problem.hidden_bytes.data() + t * row_bytes).ok());
    }
    call->reset();
    destroyed = true;
  }
  EXPECT_EQ(late_calls.load(), 0);
  EXPECT_TRUE((*engine)->healthy());
  auto run = RunProblem(**engine, problem, AllOutputsSpec(Strategy::kChunked), {});
  ASSERT_TRUE(run.ok()) << run.status();
  ReferenceOutput ref =
      ComputeReference(MakeReferenceInput(problem, AllOutputsSpec(Strategy::kChunked)));
  EXPECT_LE(Compare(*run, ref).grad_input, 5e-3);
}

TEST(CudaEngineTest, InfoReportsDeviceAndBudget) {
  auto engine = MakeEngine(/*budget_mb=*/512);
  SKIP_WITHOUT_GPU(engine);
  EngineInfo info = (*engine)->info();
  EXPECT_EQ(info.name.rfind("cuda:", 0), 0u) << info.name;
  EXPECT_EQ(info.workspace_budget_bytes, int64_t{512} << 20);
  EXPECT_GT(info.device_memory_total, 0);
  EXPECT_GT(info.device_memory_used, 0);
}

// A gradient buffer's memory is kept for the next one of its size (no
// cudaMalloc / cudaFree per call), comes back zeroed, and goes back to the
// driver when cudaMalloc would otherwise run out.
TEST(CudaEngineTest, GradBufferMemoryIsReusedZeroedAndReclaimed) {
  auto engine = MakeEngine(/*budget_mb=*/512);
  SKIP_WITHOUT_GPU(engine);
  HeadSpec spec{100003, 1024, DType::kBF16, true};  // ~400 MB of fp32
  cuda::DeviceContext* ctx = (*engine)->context();
  const int spares_before = ctx->spare_grad_buffers();
  const float* first_memory = nullptr;
  {
    auto grad = (*engine)->NewGradBuffer(spec);
    ASSERT_TRUE(grad.ok()) << grad.status();
    first_memory = static_cast<cuda::CudaGradBuffer*>(grad->get())->weight();
    const int32_t ids[2] = {7, 100002};
    const std::vector<float> rows(2 * 1024, 1.5f);
    ASSERT_TRUE((*grad)->ScatterAddRows(ids, 2, rows.data(), DType::kF32, true).ok());
  }
  EXPECT_EQ(ctx->spare_grad_buffers(), std::min(spares_before + 1, 2));
  auto again = (*engine)->NewGradBuffer(spec);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(static_cast<cuda::CudaGradBuffer*>(again->get())->weight(), first_memory);
  std::vector<float> row(1024, -1.0f), bias(1, -1.0f);
  for (int64_t r : {int64_t{7}, int64_t{100002}}) {
    ASSERT_TRUE((*again)->CopyWeightRows(r, 1, DType::kF32, row.data()).ok());
    EXPECT_EQ(*std::max_element(row.begin(), row.end()), 0.0f) << "row " << r;
    EXPECT_EQ(*std::min_element(row.begin(), row.end()), 0.0f) << "row " << r;
  }
  ASSERT_TRUE((*again)->CopyBias(7, 1, DType::kF32, bias.data()).ok());
  EXPECT_EQ(bias[0], 0.0f);
  again->reset();
  ASSERT_GE(ctx->spare_grad_buffers(), 1);
  // More than is free, less than is free with the spares given back.
  size_t free_bytes = 0, total_bytes = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_bytes, &total_bytes), cudaSuccess);
  auto big = cuda::DeviceBuffer::Allocate(static_cast<int64_t>(free_bytes) + (int64_t{100} << 20),
                                          ctx->health());
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_EQ(ctx->spare_grad_buffers(), 0);
  EXPECT_TRUE((*engine)->healthy());
}

// The plugin this tree builds loads through the server's loader.
TEST(CudaEngineTest, PluginLoadsThroughLoadCudaEngine) {
  std::string path = FLCE_TEST_CUDA_PLUGIN;
  if (const char* env = std::getenv("FLCE_CUDA_PLUGIN"); env != nullptr && *env != '\0') {
    path = env;
  }
  if (access(path.c_str(), R_OK) != 0) GTEST_SKIP() << "plugin not built at " << path;
  auto engine = LoadCudaEngine(EngineConfig{}, path);
  if (!engine.ok() && engine.status().code() == absl::StatusCode::kUnavailable) {
    GTEST_SKIP() << "no CUDA device: " << engine.status().message();
  }
  ASSERT_TRUE(engine.ok()) << engine.status();
  EXPECT_EQ((*engine)->info().name.rfind("cuda:", 0), 0u);
}

// A sticky device error (here: an illegal address, on purpose) turns health
// off and every later call into UNAVAILABLE. Runs in a child process: the
// context is unusable afterwards.
TEST(CudaEngineDeathTest, StickyErrorMakesEngineUnavailable) {
  {
    auto probe = MakeEngine(64);
    SKIP_WITHOUT_GPU(probe);
  }
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        auto engine = MakeEngine(64);
        if (!engine.ok()) std::_Exit(2);
        Problem problem = MakeProblem(ProblemSpec{});
        auto head = BuildHead(**engine, problem, 1);
        if (!head.ok()) std::_Exit(3);
        absl::Status fault = (*engine)->InjectDeviceFaultForTesting();
        if (fault.code() != absl::StatusCode::kUnavailable) std::_Exit(4);
        if ((*engine)->healthy()) std::_Exit(5);
        ComputeSpec spec = AllOutputsSpec(Strategy::kChunked);
        spec.num_tokens = problem.spec.num_tokens;
        spec.hidden_dtype = problem.spec.hidden_dtype;
        spec.targets = problem.targets;
        auto call = (*engine)->StartCompute(*head, spec, [](int64_t, int64_t, std::string) {});
        if (call.ok() || call.status().code() != absl::StatusCode::kUnavailable) std::_Exit(6);
        auto grad = (*engine)->NewGradBuffer(HeadSpecOf(problem));
        if (grad.ok() || grad.status().code() != absl::StatusCode::kUnavailable) std::_Exit(7);
        std::fprintf(stderr, "sticky error handled: %s\n", fault.ToString().c_str());
        std::_Exit(0);
      },
      ::testing::ExitedWithCode(0), "sticky error handled");
}

}  // namespace
}  // namespace flce::test
