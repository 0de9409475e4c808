// What only the CPU engine promises: its plan's name, its workspace bound,
// its error messages, no memory for a head before its bytes, agreement across
// thread counts, and its exp's accuracy.
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <fstream>
#include <limits>
#include <algorithm>
#include <string>

#include "core/status_macros.h"
#include "gtest/gtest.h"
#include "kernels/cpu/fast_exp.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/engine_factory.h"
#include "tests/engine/conformance_checks.h"
#include "tests/support/device_fingerprint_reference.h"
#include "tests/support/engine_harness.h"
#include "tests/support/problem.h"
#include "tests/support/reference_f64.h"

namespace flce::test {
namespace {

std::unique_ptr<Engine> MakeCpu(int64_t workspace_bytes, int threads) {
  EngineConfig config;
  config.workspace_bytes = workspace_bytes;
  config.threads = threads;
  absl::StatusOr<std::unique_ptr<Engine>> engine = CreateCpuEngine(config);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return engine.ok() ? std::move(*engine) : nullptr;
}

ComputeSpec AllOutputs() {
  ComputeSpec spec;
  spec.outputs.per_token_loss = true;
  spec.outputs.logprob = true;
  spec.outputs.entropy = true;
  spec.outputs.accuracy = true;
  return spec;
}

TEST(CpuEngineTest, EveryStrategyRunsTheChunkedPlan) {
  auto engine = MakeCpu(64 << 20, 2);
  ASSERT_NE(engine, nullptr);
  EXPECT_EQ(engine->info().name, "cpu");
  EXPECT_TRUE(engine->healthy());
  Problem problem = MakeProblem(ProblemSpec{});
  for (Strategy strategy : {Strategy::kAuto, Strategy::kChunked, Strategy::kVocabSplit,
                            Strategy::kFuseMN, Strategy::kSeparate, Strategy::kNaive}) {
    ComputeSpec spec = AllOutputs();
    spec.strategy = strategy;
    auto run = RunProblem(*engine, problem, spec, {});
    ASSERT_TRUE(run.ok()) << run.status();
    EXPECT_EQ(run->result.strategy_used, "cpu_chunked");
  }
}

TEST(CpuEngineTest, WorkspaceStaysWithinBudgetAndBelowTokensTimesVocab) {
  const int64_t budget = 1 << 20;
  auto engine = MakeCpu(budget, 2);
  ASSERT_NE(engine, nullptr);
  ProblemSpec ps;
  ps.vocab_size = 1009;
  ps.hidden_size = 32;
  ps.num_tokens = 700;  // 700 x 1009 fp32 logits = 2.8 MB > budget
  ps.has_bias = true;
  Problem problem = MakeProblem(ps);
  ComputeSpec spec = AllOutputs();
  HarnessOptions options;
  options.rows_per_block = 128;
  auto run = RunProblem(*engine, problem, spec, options);
  ASSERT_TRUE(run.ok()) << run.status();
  ReferenceOutput ref = ComputeReference(MakeReferenceInput(problem, spec));
  ExpectMatchesReference(*run, ref, spec, ToleranceFor("cpu", DType::kF32, DType::kF32, 700));
  const EngineInfo info = engine->info();
  EXPECT_EQ(info.workspace_budget_bytes, budget);
  EXPECT_GT(info.workspace_peak_bytes, 0);
  EXPECT_LE(info.workspace_peak_bytes, budget);
  EXPECT_LT(info.workspace_peak_bytes, ps.num_tokens * ps.vocab_size * 4);
}

TEST(CpuEngineTest, BudgetBelowOneTokenIsResourceExhausted) {
  auto engine = MakeCpu(4096, 1);
  ASSERT_NE(engine, nullptr);
  ProblemSpec ps;
  ps.vocab_size = 2000;  // one row of logits alone is 8000 bytes
  Problem problem = MakeProblem(ps);
  auto run = RunProblem(*engine, problem, AllOutputs(), {});
  EXPECT_EQ(run.status().code(), absl::StatusCode::kResourceExhausted) << run.status();
}

TEST(CpuEngineTest, BadConfigIsRejected) {
  EngineConfig config;
  config.workspace_bytes = 0;
  EXPECT_EQ(CreateCpuEngine(config).status().code(), absl::StatusCode::kInvalidArgument);
  config.workspace_bytes = 1 << 20;
  config.threads = -1;
  EXPECT_EQ(CreateCpuEngine(config).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(CpuEngineTest, MessagesNameTheTokenAndTheValue) {
  auto engine = MakeCpu(64 << 20, 2);
  ASSERT_NE(engine, nullptr);
  ProblemSpec ps;
  ps.ignore_fraction = 0.0;
  Problem problem = MakeProblem(ps);
  auto head = BuildHead(*engine, problem, 1);
  ASSERT_TRUE(head.ok());
  ComputeSpec spec = AllOutputs();
  spec.num_tokens = ps.num_tokens;
  spec.hidden_dtype = DType::kF32;
  spec.targets = problem.targets;
  spec.targets[11] = 257;
  spec.targets[12] = -3;
  auto noop = [](int64_t, int64_t, std::string) {};
  absl::Status status = engine->StartCompute(*head, spec, noop).status();
  EXPECT_EQ(status.message(),
            "targets[11] = 257 is outside [0, 257) and is not ignore_index (-100)");

  spec.targets = problem.targets;
  auto call = engine->StartCompute(*head, spec, noop);
  ASSERT_TRUE(call.ok());
  const char* rows = problem.hidden_bytes.data();
  ASSERT_TRUE((*call)->AddHidden(0, 4, rows).ok());
  status = (*call)->AddHidden(2, 4, rows);
  EXPECT_EQ(status.message(), "hidden rows [2, 6) overlap token 2, which was already given");
  status = (*call)->Finish().status();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(status.message(), "hidden of token 4 never given (4 of 48 tokens received)");
}

TEST(CpuEngineTest, NonFiniteWeightIsRefused) {
  auto engine = MakeCpu(64 << 20, 1);
  ASSERT_NE(engine, nullptr);
  HeadSpec spec{5, 4, DType::kF32, false};
  std::vector<float> weight(20, 0.5f);
  weight[9] = std::numeric_limits<float>::infinity();
  auto builder = engine->BeginHead(spec);
  ASSERT_TRUE(builder.ok());
  ASSERT_TRUE((*builder)->WriteWeight(0, weight.data(), 80).ok());
  absl::Status status = (*builder)->Finish().status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "weight element (2, 1) is not finite (NaN or Inf)");
}

TEST(CpuEngineTest, AbsurdHeadIsRefusedBeforeAnyAllocation) {
  auto engine = MakeCpu(64 << 20, 1);
  ASSERT_NE(engine, nullptr);
  auto builder = engine->BeginHead(HeadSpec{int64_t{1} << 31, int64_t{1} << 20, DType::kBF16});
  EXPECT_EQ(builder.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(builder.status().message().find("V=2147483648"), absl::string_view::npos)
      << builder.status();
}

int64_t ResidentBytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t size = 0;
  int64_t resident = 0;
  statm >> size >> resident;
  return resident * sysconf(_SC_PAGESIZE);
}

// A head whose header arrived but whose bytes did not must cost no memory:
// otherwise a client that declares heads and never sends them fills the host.
TEST(CpuEngineTest, HeadBytesAreNotResidentBeforeTheyArrive) {
  auto engine = MakeCpu(64 << 20, 1);
  ASSERT_NE(engine, nullptr);
  const int64_t before = ResidentBytes();
  auto builder = engine->BeginHead(HeadSpec{131072, 1024, DType::kF32});  // 512 MiB
  ASSERT_TRUE(builder.ok()) << builder.status();
  const int64_t declared = ResidentBytes() - before;
  EXPECT_LT(declared, 32 << 20) << "BeginHead made " << declared << " bytes resident";
  const int64_t chunk_bytes = int64_t{4} << 20;
  std::string chunk(chunk_bytes, '\x3f');
  for (int64_t i = 0; i < 16; ++i) {
    ASSERT_TRUE((*builder)->WriteWeight(i * chunk_bytes, chunk.data(), chunk_bytes).ok());
  }
  const int64_t written = ResidentBytes() - before;
  EXPECT_GT(written, 48 << 20) << "64 MiB were written";  // the measure itself works
  EXPECT_LT(written, 96 << 20) << "only the written bytes should be resident";
}

// A call over a fresh 4-token problem's head, its hidden not yet given.
absl::StatusOr<std::unique_ptr<ComputeCall>> StartFourTokenCall(Engine& engine, Problem* problem) {
  ProblemSpec ps;
  ps.num_tokens = 4;
  *problem = MakeProblem(ps);
  FLCE_ASSIGN_OR_RETURN(auto head, BuildHead(engine, *problem, 1));
  ComputeSpec spec = AllOutputs();
  spec.num_tokens = 4;
  spec.hidden_dtype = DType::kF32;
  spec.targets = problem->targets;
  return engine.StartCompute(head, spec, [](int64_t, int64_t, std::string) {});
}

TEST(CpuEngineTest, AddHiddenAfterFinishFails) {
  auto engine = MakeCpu(64 << 20, 2);
  ASSERT_NE(engine, nullptr);
  Problem problem;
  auto call = StartFourTokenCall(*engine, &problem);
  ASSERT_TRUE(call.ok()) << call.status();
  ASSERT_TRUE((*call)->AddHidden(0, 4, problem.hidden_bytes.data()).ok());
  ASSERT_TRUE((*call)->Finish().ok());
  EXPECT_EQ((*call)->AddHidden(0, 1, problem.hidden_bytes.data()).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*call)->Finish().status().code(), absl::StatusCode::kFailedPrecondition);
}

// CUDA IPC is the CUDA engine's: the CPU engine says so instead of failing
// later or silently.
TEST(CpuEngineTest, PeerMemoryIsRefusedWithTheReason) {
  auto engine = MakeCpu(64 << 20, 2);
  ASSERT_NE(engine, nullptr);
  EXPECT_TRUE(engine->info().device_uuid.empty());
  PeerMemoryHandle handle;
  handle.memory_handle = std::string(64, '\1');
  handle.event_handle = std::string(64, '\2');
  handle.bytes = 4096;
  handle.key = std::string(16, 'k');
  absl::Status opened = engine->OpenPeerMemory(handle).status();
  EXPECT_EQ(opened.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(opened.message().find("CUDA engine"), std::string::npos) << opened;
  Problem problem;
  auto call = StartFourTokenCall(*engine, &problem);
  ASSERT_TRUE(call.ok()) << call.status();
  class NoMemory : public PeerMemory {
    int64_t bytes() const override { return 1 << 20; }
  } memory;
  EXPECT_EQ((*call)->AddHiddenFromPeer(0, 4, memory, 0).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

// The device fingerprint (engine.h), on the host: pieces add up to the whole,
// and moving a row, swapping two elements of a row or flipping one bit
// changes it.
TEST(DeviceHiddenFingerprintTest, SumsOverPiecesAndSeesEveryChange) {
  for (DType dtype : {DType::kBF16, DType::kF32}) {
    SCOPED_TRACE(DTypeName(dtype));
    ProblemSpec ps;
    ps.num_tokens = 9;
    ps.hidden_size = 11;
    ps.hidden_dtype = dtype;
    Problem problem = MakeProblem(ps);
    const int64_t row = 11 * DTypeSize(dtype);
    const std::string& bytes = problem.hidden_bytes;
    const uint64_t whole = DeviceHiddenFingerprint(dtype, bytes.data(), 9, 11, 0);
    EXPECT_EQ(DeviceHiddenFingerprint(dtype, bytes.data(), 4, 11, 0) +
                  DeviceHiddenFingerprint(dtype, bytes.data() + 4 * row, 5, 11, 4),
              whole);
    std::string swapped_rows = bytes;
    std::swap_ranges(swapped_rows.begin(), swapped_rows.begin() + row,
                     swapped_rows.begin() + row);
    EXPECT_NE(DeviceHiddenFingerprint(dtype, swapped_rows.data(), 9, 11, 0), whole);
    std::string swapped_columns = bytes;
    const int64_t size = DTypeSize(dtype);
    std::swap_ranges(swapped_columns.begin(), swapped_columns.begin() + size,
                     swapped_columns.begin() + size);
    if (swapped_columns != bytes) {
      EXPECT_NE(DeviceHiddenFingerprint(dtype, swapped_columns.data(), 9, 11, 0), whole);
    }
    std::string flipped = bytes;
    flipped[5 * row + 3] ^= 1;
    EXPECT_NE(DeviceHiddenFingerprint(dtype, flipped.data(), 9, 11, 0), whole);
  }
}

TEST(CpuEngineTest, ThreadCountsAgree) {
  // Not bitwise: OpenBLAS picks its kernels and blocking by thread count and
  // shape. Each thread count is repeatable on its own (EngineProtocolTest).
  ProblemSpec ps;
  ps.vocab_size = 3001;
  ps.hidden_size = 96;
  ps.num_tokens = 130;
  ps.has_bias = true;
  Problem problem = MakeProblem(ps);
  ComputeSpec spec = AllOutputs();
  spec.chunk_tokens = 64;
  HarnessOptions options;
  options.seed = FreshSeed();
  options.rows_per_block = 16;
  std::vector<EngineRun> runs;
  for (int threads : {1, 2, 3}) {
    auto engine = MakeCpu(64 << 20, threads);
    ASSERT_NE(engine, nullptr);
    auto run = RunProblem(*engine, problem, spec, options);
    ASSERT_TRUE(run.ok()) << run.status();
    runs.push_back(std::move(*run));
  }
  for (size_t i = 1; i < runs.size(); ++i) {
    EXPECT_LE(RelativeError({runs[i].result.loss}, {runs[0].result.loss}), 1e-6);
    EXPECT_LE(RelativeError(runs[i].grad_input, runs[0].grad_input), 1e-6);
    EXPECT_LE(RelativeError(runs[i].grad_weight, runs[0].grad_weight), 1e-6);
    EXPECT_LE(RelativeError(runs[i].grad_bias, runs[0].grad_bias), 1e-6);
  }
}

// MATH.md's peaked case under a softcap: most of a confident row's small
// gradient sits in entries whose tanh rounds to +-1 in fp32, where the
// derivative 1 - (u/c)^2 cancels to noise (4e-6 to 5e-6 relative error on
// every seed when computed that way); taken as sech^2 of the uncapped logit it
// stays near the plain case's 4e-7.
TEST(CpuEngineTest, SoftcapGradientKeepsPrecisionWhereTanhSaturates) {
  auto engine = MakeCpu(64 << 20, 2);
  ASSERT_NE(engine, nullptr);
  ProblemSpec ps;
  ps.weight_scale = 10.0;
  ps.targets_at_argmax = true;
  ps.has_bias = true;
  for (int i = 0; i < 3; ++i) {
    Problem problem = MakeProblem(ps);
    SCOPED_TRACE(::testing::Message() << "seed " << problem.seed);
    ComputeSpec spec;
    spec.options.softcap = 5.0f;
    absl::StatusOr<EngineRun> run = RunProblem(*engine, problem, spec, {});
    ASSERT_TRUE(run.ok()) << run.status();
    ReferenceOutput ref = ComputeReference(MakeReferenceInput(problem, spec));
    EXPECT_LE(RelativeError(run->grad_input, ref.grad_input), 1.5e-6);
    EXPECT_LE(RelativeError(run->grad_weight, ref.grad_weight), 1.5e-6);
    EXPECT_LE(RelativeError(run->grad_bias, ref.grad_bias), 1.5e-6);
  }
}

TEST(ThreadPoolTest, EveryIndexExactlyOnce) {
  for (int threads : {1, 2, 5}) {
    cpu::ThreadPool pool(threads);
    EXPECT_EQ(pool.threads(), threads);
    for (int64_t n : {0, 1, 7, 1000}) {
      for (int64_t grain : {1, 3, 64, 5000}) {
        std::vector<std::atomic<int>> hits(n);
        std::atomic<bool> bad_thread{false};
        pool.ParallelFor(n, grain, [&](int thread, int64_t begin, int64_t end) {
          if (thread < 0 || thread >= threads || end - begin > grain) bad_thread = true;
          for (int64_t i = begin; i < end; ++i) ++hits[i];
        });
        EXPECT_FALSE(bad_thread);
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << n << " " << grain;
      }
    }
  }
}

TEST(FastExpTest, WithinTwoUlpOfStdExp) {
  double worst = 0.0;
  for (float x = -87.0f; x <= 88.0f; x += 0.000731f) {
    const double want = std::exp(static_cast<double>(x));
    const double got = cpu::FastExp(x);
    worst = std::max(worst, std::abs(got - want) / want);
  }
  EXPECT_LE(worst, 2.5 * std::ldexp(1.0, -23)) << worst;
  EXPECT_EQ(cpu::FastExp(0.0f), 1.0f);
  EXPECT_LT(cpu::FastExp(-1000.0f), 1e-37f);
  EXPECT_GE(cpu::FastExp(-1000.0f), 0.0f);
}

TEST(FastTanhTest, CloseToTanhAndItsDerivative) {
  double worst_tanh = 0.0;
  double worst_sech2 = 0.0;
  for (float x = -40.0f; x <= 40.0f; x += 0.000377f) {
    for (float v : {x, x * 1e-3f}) {  // and a dense sweep near 0
      float sech2 = -1.0f;
      const double got = cpu::FastTanh(v, &sech2);
      const double want = std::tanh(static_cast<double>(v));
      const double c = std::cosh(static_cast<double>(v));
      if (want != 0.0) worst_tanh = std::max(worst_tanh, std::abs(got - want) / std::abs(want));
      worst_sech2 = std::max(worst_sech2, std::abs(sech2 - 1.0 / (c * c)) * (c * c));
    }
  }
  EXPECT_LE(worst_tanh, 4.0 * std::ldexp(1.0, -23)) << worst_tanh;
  EXPECT_LE(worst_sech2, 8.0 * std::ldexp(1.0, -23)) << worst_sech2;
  float sech2 = 0.0f;
  EXPECT_EQ(cpu::FastTanh(0.0f, &sech2), 0.0f);
  EXPECT_EQ(sech2, 1.0f);
  EXPECT_EQ(cpu::FastTanh(100.0f, &sech2), 1.0f);
  EXPECT_EQ(cpu::FastTanh(-100.0f, &sech2), -1.0f);
  EXPECT_LT(sech2, 1e-30f);
}

}  // namespace
}  // namespace flce::test
