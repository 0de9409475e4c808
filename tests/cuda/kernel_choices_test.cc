// The CUDA engine's kernel choices (kernels/cuda/base/kernel_choices.h): each
// FLCE_CUDA_* switch is read into the plan when the plan is made and not
// after; the thresholds pick where no switch does; and a plan's report
// (DescribeChunkKernels, KernelReport) names what its chunks run. Host-only:
// these run without a GPU too (the plans take the cuBLAS path there, and the
// tests ask for it on a GPU).
#include <cstdint>
#include <memory>
#include <string>

#include "gtest/gtest.h"
#include "kernels/cuda/base/kernel_choices.h"
#include "kernels/cuda/ops/gemm_algos.h"
#include "kernels/cuda/plans/kernel_report.h"
#include "kernels/cuda/plans/plans.h"
#include "kernels/cuda/sharded/plan_sharded.h"
#include "tests/cuda/cuda_test_util.h"

namespace flce::test {
namespace {

using cuda::BackwardGemmChoice;
using cuda::GradWeightKernel;
using cuda::GradWeightSwitch;
using cuda::KernelSwitches;
using cuda::KernelSwitchesFromEnvironment;
using cuda::StatsKernelSwitch;

TEST(KernelSwitchesTest, UnsetIsTheDefaults) {
  const KernelSwitches s = KernelSwitchesFromEnvironment();
  const KernelSwitches defaults;
  EXPECT_EQ(s.generic, defaults.generic);
  EXPECT_EQ(s.stats_kernel, StatsKernelSwitch::kAuto);
  EXPECT_EQ(s.backward, BackwardGemmChoice::kAuto);
  EXPECT_EQ(s.grad_weight, GradWeightSwitch::kAuto);
  EXPECT_TRUE(s.stats_pairs && s.backward_overlap && s.grad_weight_pairs && s.thin_grad_weight);
  EXPECT_FALSE(s.cublas_logits || s.cluster_rows || s.overlap || s.dlogits_pass);
  EXPECT_EQ(s.stats_group, 0);
  EXPECT_EQ(s.gemm_tiles, "");
  EXPECT_EQ(cuda::WireSlots(s), 3);
}

TEST(KernelSwitchesTest, EveryVariableIsRead) {
  {
    ScopedEnv a("FLCE_CUDA_GENERIC", "1"), b("FLCE_CUDA_LOGITS", "cublas"),
        c("FLCE_CUDA_STATS_KERNEL", "pingpong128"), d("FLCE_CUDA_STATS_PAIRS", "0"),
        e("FLCE_CUDA_STATS_GROUP", "4"), f("FLCE_CUDA_ROW_KERNEL", "cluster"),
        g("FLCE_CUDA_OVERLAP", "1"), h("FLCE_CUDA_DLOGITS_PASS", "1"),
        i("FLCE_CUDA_BACKWARD", "own"), j("FLCE_CUDA_GRAD_WEIGHT", "cooperative"),
        k("FLCE_CUDA_BACKWARD_OVERLAP", "0"), l("FLCE_CUDA_GRAD_WEIGHT_PAIRS", "0"),
        m("FLCE_CUDA_THIN_GRAD_WEIGHT", "0"), n("FLCE_CUDA_GEMM_TILES", "128x160"),
        o("FLCE_CUDA_WIRE_SLOTS", "2");
    const KernelSwitches s = KernelSwitchesFromEnvironment();
    EXPECT_TRUE(s.generic);
    EXPECT_TRUE(s.cublas_logits);
    EXPECT_EQ(s.stats_kernel, StatsKernelSwitch::kPingPong128);
    EXPECT_FALSE(s.stats_pairs);
    EXPECT_EQ(s.stats_group, 4);
    EXPECT_TRUE(s.cluster_rows);
    EXPECT_TRUE(s.overlap);
    EXPECT_TRUE(s.dlogits_pass);
    EXPECT_EQ(s.backward, BackwardGemmChoice::kOwn);
    EXPECT_EQ(s.grad_weight, GradWeightSwitch::kCooperative);
    EXPECT_FALSE(s.backward_overlap);
    EXPECT_FALSE(s.grad_weight_pairs);
    EXPECT_FALSE(s.thin_grad_weight);
    EXPECT_EQ(s.gemm_tiles, "128x160");
    EXPECT_EQ(cuda::WireSlots(s), 2);
  }
  // The other spellings each variable knows.
  {
    ScopedEnv a("FLCE_CUDA_STATS_KERNEL", "pingpong"), b("FLCE_CUDA_BACKWARD", "cublas"),
        c("FLCE_CUDA_GRAD_WEIGHT", "pingpong");
    const KernelSwitches s = KernelSwitchesFromEnvironment();
    EXPECT_EQ(s.stats_kernel, StatsKernelSwitch::kPingPong192);
    EXPECT_EQ(s.backward, BackwardGemmChoice::kCublas);
    EXPECT_EQ(s.grad_weight, GradWeightSwitch::kPingPong);
  }
  {
    ScopedEnv a("FLCE_CUDA_STATS_KERNEL", "cooperative"), b("FLCE_CUDA_GRAD_WEIGHT", "cublas");
    const KernelSwitches s = KernelSwitchesFromEnvironment();
    EXPECT_EQ(s.stats_kernel, StatsKernelSwitch::kCooperative);
    EXPECT_EQ(s.grad_weight, GradWeightSwitch::kCublas);
  }
  // A value a variable does not know reads as its default (the engine refuses
  // to start with one: CheckKernelSwitchSpellings).
  {
    ScopedEnv a("FLCE_CUDA_STATS_KERNEL", "fastest"), b("FLCE_CUDA_BACKWARD", "mine"),
        c("FLCE_CUDA_ROW_KERNEL", "two_pass"), d("FLCE_CUDA_OVERLAP", "yes");
    const KernelSwitches s = KernelSwitchesFromEnvironment();
    EXPECT_EQ(s.stats_kernel, StatsKernelSwitch::kAuto);
    EXPECT_EQ(s.backward, BackwardGemmChoice::kAuto);
    EXPECT_FALSE(s.cluster_rows);
    EXPECT_FALSE(s.overlap);
  }
}

TEST(KernelSwitchesTest, EverySpellingReadIsAccepted) {
  EXPECT_TRUE(cuda::CheckKernelSwitchSpellings().ok());
  ScopedEnv a("FLCE_CUDA_GENERIC", "0"), b("FLCE_CUDA_LOGITS", "cublas"),
      c("FLCE_CUDA_STATS_KERNEL", "pingpong"), d("FLCE_CUDA_STATS_PAIRS", "1"),
      e("FLCE_CUDA_STATS_GROUP", "16"), f("FLCE_CUDA_ROW_KERNEL", "cluster"),
      g("FLCE_CUDA_OVERLAP", "0"), h("FLCE_CUDA_DLOGITS_PASS", "1"),
      i("FLCE_CUDA_BACKWARD", "cublas"), j("FLCE_CUDA_GRAD_WEIGHT", "pingpong"),
      k("FLCE_CUDA_BACKWARD_OVERLAP", "1"), l("FLCE_CUDA_GRAD_WEIGHT_PAIRS", "0"),
      m("FLCE_CUDA_THIN_GRAD_WEIGHT", "1"), n("FLCE_CUDA_WIRE_SLOTS", "3");
  EXPECT_TRUE(cuda::CheckKernelSwitchSpellings().ok());
  for (const char* kernel : {"cooperative", "pingpong128", "pingpong192"}) {
    ScopedEnv stats("FLCE_CUDA_STATS_KERNEL", kernel);
    EXPECT_TRUE(cuda::CheckKernelSwitchSpellings().ok()) << kernel;
  }
  ScopedEnv empty("FLCE_CUDA_BACKWARD", "");  // set to nothing reads as unset
  EXPECT_TRUE(cuda::CheckKernelSwitchSpellings().ok());
}

// A misspelt switch would otherwise run the default kernels while the
// operator believes they asked for others.
TEST(KernelSwitchesTest, AValueNoSwitchReadsIsRefusedNamingIt) {
  struct Case {
    const char* name;
    const char* value;
    const char* expected;
  };
  for (const Case& c : {
           Case{"FLCE_CUDA_BACKWARD", "mine", "FLCE_CUDA_BACKWARD=mine: expected own, cublas"},
           Case{"FLCE_CUDA_STATS_KERNEL", "fastest",
                "expected cooperative, pingpong128, pingpong192, pingpong"},
           Case{"FLCE_CUDA_OVERLAP", "yes", "FLCE_CUDA_OVERLAP=yes: expected 0, 1"},
           Case{"FLCE_CUDA_ROW_KERNEL", "two_pass", "expected cluster, or unset"},
           Case{"FLCE_CUDA_STATS_GROUP", "-2", "a token-tile count"},
           Case{"FLCE_CUDA_STATS_GROUP", "4x", "FLCE_CUDA_STATS_GROUP=4x"},
           Case{"FLCE_CUDA_GRAD_WEIGHT", "own", "FLCE_CUDA_GRAD_WEIGHT=own"},
           Case{"FLCE_CUDA_WIRE_SLOTS", "4", "FLCE_CUDA_WIRE_SLOTS=4: expected 2, 3"},
       }) {
    ScopedEnv bad(c.name, c.value);
    const absl::Status status = cuda::CheckKernelSwitchSpellings();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.name << "=" << c.value;
    EXPECT_NE(status.message().find(c.expected), std::string::npos) << status.message();
  }
}

TEST(KernelSwitchesTest, AVariableNoPartOfTheEngineReadsIsRefusedNamingIt) {
  {
    ScopedEnv misspelt("FLCE_CUDA_STATS_KERNAL", "pingpong128");
    const absl::Status status = cuda::CheckKernelSwitchSpellings();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(status.message().find("FLCE_CUDA_STATS_KERNAL is not a variable"),
              std::string::npos)
        << status.message();
    EXPECT_NE(status.message().find("FLCE_CUDA_STATS_KERNEL"), std::string::npos)
        << status.message();
  }
  {
    ScopedEnv retired("FLCE_CUDA_STATS_EPILOGUE", "store_only");
    EXPECT_EQ(cuda::CheckKernelSwitchSpellings().code(), absl::StatusCode::kInvalidArgument);
  }
  // Set to nothing reads as unset; the plugin's path and the tile list are
  // read by other parts of the engine; other prefixes are not the engine's.
  ScopedEnv empty("FLCE_CUDA_STATS_KERNAL", "");
  ScopedEnv plugin("FLCE_CUDA_PLUGIN", "/nonexistent/libflce_cuda.so");
  ScopedEnv tiles("FLCE_CUDA_GEMM_TILES", "128x128");
  ScopedEnv other("FLCE_CUDAX_ANYTHING", "1");
  EXPECT_TRUE(cuda::CheckKernelSwitchSpellings().ok()) << cuda::CheckKernelSwitchSpellings();
}

TEST(KernelSwitchesTest, AnEngineWithAMisspeltSwitchIsNotCreated) {
  {
    auto engine = MakeEngine();
    SKIP_WITHOUT_GPU(engine);
  }
  ScopedEnv bad("FLCE_CUDA_GRAD_WEIGHT", "pinpong");
  auto engine = MakeEngine();
  ASSERT_FALSE(engine.ok());
  EXPECT_EQ(engine.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(engine.status().message().find("FLCE_CUDA_GRAD_WEIGHT=pinpong"), std::string::npos)
      << engine.status().message();
}

TEST(KernelChoicesTest, StatsKernelByChunkRowsUnlessSwitched) {
  KernelSwitches s;
  EXPECT_EQ(cuda::StatsPingPongCols(s, 96), 192);  // 3/4 of a 128-token tile
  EXPECT_EQ(cuda::StatsPingPongCols(s, 95), 0);    // streams W: cooperative
  EXPECT_EQ(cuda::StatsPingPongCols(s, 5632), 192);
  EXPECT_TRUE(cuda::StatsPingPongPairs(s, 129));
  EXPECT_FALSE(cuda::StatsPingPongPairs(s, 128));  // one token tile: nothing to share
  s.stats_kernel = StatsKernelSwitch::kCooperative;
  EXPECT_EQ(cuda::StatsPingPongCols(s, 5632), 0);
  s.stats_kernel = StatsKernelSwitch::kPingPong128;
  EXPECT_EQ(cuda::StatsPingPongCols(s, 8), 128);
  s.stats_kernel = StatsKernelSwitch::kPingPong192;
  EXPECT_EQ(cuda::StatsPingPongCols(s, 8), 192);
  s.stats_pairs = false;
  EXPECT_FALSE(cuda::StatsPingPongPairs(s, 5632));
  EXPECT_EQ(cuda::StatsTokenTilesPerGroup(s, 44), 44);  // one group
  s.stats_group = 4;
  EXPECT_EQ(cuda::StatsTokenTilesPerGroup(s, 44), 4);
  EXPECT_EQ(cuda::StatsTokenTilesPerGroup(s, 3), 3);  // no larger than the chunk
}

TEST(KernelChoicesTest, RowPassAndBackwardChoices) {
  KernelSwitches s;
  EXPECT_FALSE(cuda::OverlapChosen(s, 4096));
  EXPECT_FALSE(cuda::ClusterRowsChosen(s));
  s.overlap = true;
  EXPECT_TRUE(cuda::OverlapChosen(s, 128));
  EXPECT_FALSE(cuda::OverlapChosen(s, 127));  // two halves of 64-token alignment
  s.cluster_rows = true;
  EXPECT_TRUE(cuda::ClusterRowsChosen(s));
  s.generic = true;
  EXPECT_FALSE(cuda::ClusterRowsChosen(s));  // the plans of GPUs before Hopper
  EXPECT_FALSE(cuda::HopperKernelsFor(s, DType::kBF16, 4096));

  KernelSwitches b;
  EXPECT_TRUE(cuda::UseThinGradWeight(b, cuda::kThinGradWeightRows));
  EXPECT_FALSE(cuda::UseThinGradWeight(b, cuda::kThinGradWeightRows + 1));
  EXPECT_TRUE(cuda::GradWeightBesideGradInput(b));
  EXPECT_EQ(cuda::GradWeightKernelOf(b), GradWeightKernel::kPingPong);
  EXPECT_TRUE(cuda::GradWeightPairs(b));
  b.thin_grad_weight = false;
  EXPECT_FALSE(cuda::UseThinGradWeight(b, 1));
  b.grad_weight = GradWeightSwitch::kCooperative;
  EXPECT_EQ(cuda::GradWeightKernelOf(b), GradWeightKernel::kCooperative);
  EXPECT_FALSE(cuda::GradWeightBesideGradInput(b));  // only the ping-pong kernel starts beside
  b.grad_weight = GradWeightSwitch::kAuto;
  b.backward_overlap = false;
  EXPECT_FALSE(cuda::GradWeightBesideGradInput(b));
  b.grad_weight_pairs = false;
  EXPECT_FALSE(cuda::GradWeightPairs(b));
  // cuBLAS asked for: never the own GEMMs, whatever the device.
  b.backward = BackwardGemmChoice::kCublas;
  EXPECT_FALSE(cuda::UseOwnGradInputGemm(b, DType::kBF16, 8192, 1024, 4, true));
  EXPECT_FALSE(cuda::UseOwnGradWeightGemm(b, DType::kBF16, 8192, 2048));
  // fp32 heads have none.
  b.backward = BackwardGemmChoice::kOwn;
  EXPECT_FALSE(cuda::UseOwnGradInputGemm(b, DType::kF32, 8192, 1024, 4, true));
  EXPECT_FALSE(cuda::UseOwnGradWeightGemm(b, DType::kF32, 8192, 2048));
}

cuda::HeadView Bf16Head(int64_t hidden) {
  cuda::HeadView head;
  head.dtype = DType::kBF16;
  head.vocab = 32000;
  head.padded_vocab = 32000;
  head.hidden = hidden;
  return head;
}

cuda::Plan ChunkedPlan(const cuda::HeadView& head, int64_t tokens, int64_t chunk_tokens,
                       Strategy strategy = Strategy::kChunked) {
  cuda::PlanRequest req;
  req.strategy = strategy;
  req.num_tokens = tokens;
  req.hidden_dtype = head.dtype;
  req.chunk_tokens = chunk_tokens;
  auto plan = cuda::MakePlan(head, req, int64_t{2048} << 20);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return plan.ok() ? *plan : cuda::Plan{};
}

TEST(KernelChoicesTest, APlanKeepsTheSwitchesItWasMadeWith) {
  const cuda::HeadView head = Bf16Head(1024);
  cuda::Plan plan;
  {
    ScopedEnv overlap("FLCE_CUDA_OVERLAP", "1"), tiles("FLCE_CUDA_GEMM_TILES", "cublas");
    plan = ChunkedPlan(head, 4096, 0);
  }
  EXPECT_TRUE(plan.switches.overlap);
  EXPECT_EQ(plan.switches.gemm_tiles, "cublas");
  EXPECT_FALSE(ChunkedPlan(head, 4096, 0).switches.overlap);
}

// A measured grad_W algorithm may differ from process to process: a
// deterministic request's plan keeps the fixed tile list, the others measure.
TEST(KernelChoicesTest, ADeterministicPlanDoesNotMeasureGradWeightAlgorithms) {
  ScopedEnv tiles("FLCE_CUDA_GEMM_TILES", "measured");
  const cuda::HeadView head = Bf16Head(1024);
  cuda::PlanRequest req;
  req.strategy = Strategy::kChunked;
  req.num_tokens = 4096;
  req.hidden_dtype = head.dtype;
  for (const bool deterministic : {false, true}) {
    req.deterministic = deterministic;
    auto plan = cuda::MakePlan(head, req, int64_t{2048} << 20);
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_EQ(plan->switches.gemm_tiles, deterministic ? "" : "measured");
    auto shards = cuda::MakeShardPlan({head, head}, req, int64_t{2048} << 20);
    ASSERT_TRUE(shards.ok()) << shards.status();
    EXPECT_EQ(shards->switches.gemm_tiles, deterministic ? "" : "measured");
  }
}

// A request's rows and outputs: the report reads which are asked for, never
// their memory.
cuda::DeviceRequest Request(int64_t rows, bool backward) {
  static float marker = 0.0f;
  cuda::DeviceRequest r;
  r.rows = rows;
  r.hidden_dtype = DType::kBF16;
  if (backward) {
    r.grad_input = &marker;
    r.grad_weight = &marker;
  }
  return r;
}

class KernelReportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto algos = cuda::GemmAlgos::Create();
    ASSERT_TRUE(algos.ok()) << algos.status();
    algos_ = std::move(*algos);
    exec_.gemm_algos = algos_.get();
  }
  // The text of a whole request of `tokens` under a chunked plan of
  // `chunk` tokens, on the cuBLAS logits path (on any GPU).
  std::string Report(int64_t tokens, int64_t chunk, bool backward,
                     Strategy strategy = Strategy::kChunked) {
    ScopedEnv logits("FLCE_CUDA_LOGITS", "cublas");
    const cuda::HeadView head = Bf16Head(1024);
    const cuda::Plan plan = ChunkedPlan(head, tokens, chunk, strategy);
    cuda::KernelReport report;
    report.AddRequest(exec_, head, plan, Request(tokens, backward));
    return report.Text();
  }
  std::unique_ptr<cuda::GemmAlgos> algos_;
  cuda::Exec exec_;
};

TEST_F(KernelReportTest, ChunksThatRunDifferentKernelsAreNamedByTheirTokens) {
  // Two full chunks on cuBLAS's preferred tile for grad_W, a 4-token tail on
  // the streaming pass.
  EXPECT_EQ(Report(4100, 2048, true),
            "2048 tokens: logits=cublas_fp32 rows=two_pass grad_input=cublas "
            "grad_weight=cublas_preferred_tile; 4 tokens: logits=cublas_fp32 rows=two_pass "
            "grad_input=cublas grad_weight=thin_pass");
  // Without a backward the chunks run the same kernels: one description.
  EXPECT_EQ(Report(4100, 2048, false), "logits=cublas_fp32 rows=two_pass");
}

TEST_F(KernelReportTest, SwitchesChangeTheReport) {
  {
    ScopedEnv thin("FLCE_CUDA_THIN_GRAD_WEIGHT", "0"), tiles("FLCE_CUDA_GEMM_TILES", "cublas");
    EXPECT_EQ(Report(4100, 2048, true),
              "logits=cublas_fp32 rows=two_pass grad_input=cublas grad_weight=cublas");
  }
  {
    ScopedEnv tiles("FLCE_CUDA_GEMM_TILES", "measured");
    EXPECT_EQ(Report(4100, 2048, true),
              "2048 tokens: logits=cublas_fp32 rows=two_pass grad_input=cublas "
              "grad_weight=cublas_measured; 4 tokens: logits=cublas_fp32 rows=two_pass "
              "grad_input=cublas grad_weight=thin_pass");
  }
  {
    ScopedEnv overlap("FLCE_CUDA_OVERLAP", "1");
    static int side_marker = 0;
    exec_.side = reinterpret_cast<cudaStream_t>(&side_marker);  // compared, never used
    EXPECT_EQ(Report(2048, 1024, true),
              "logits=cublas_fp32 rows=two_pass+half_chunk_overlap grad_input=cublas "
              "grad_weight=cublas");  // 1024-token chunks: below the preferred tile's 2048
    exec_.side = nullptr;
    EXPECT_EQ(Report(2048, 1024, true),
              "logits=cublas_fp32 rows=two_pass grad_input=cublas grad_weight=cublas");
  }
}

TEST_F(KernelReportTest, VocabSplitBlocks) {
  EXPECT_EQ(Report(300, 0, true, Strategy::kVocabSplit),
            "logits=cublas_fp32_splits rows=online_softmax grad_input=cublas grad_weight=cublas");
}

}  // namespace
}  // namespace flce::test
