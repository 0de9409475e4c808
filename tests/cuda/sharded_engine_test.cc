// A head split by vocabulary across GPUs, beyond the conformance suites
// (which run every strategy and option on "cuda_shards2" / "cuda_shards3"
// against the float64 reference): the row layout, the strategies it refuses
// or replaces, the sharded result next to the one-GPU engine's, determinism,
// and NCCL itself (one rank on a one-GPU host).
#include "kernels/cuda/sharded/sharded_engine.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/sharded/sharded_objects.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/support/engine_harness.h"
#include "tests/support/problem.h"
#include "tests/support/reference_f64.h"

namespace flce::test {
namespace {

using cuda::ShardedEngine;
using cuda::VocabShards;

absl::StatusOr<std::unique_ptr<ShardedEngine>> MakeSharded(std::vector<int> devices,
                                                          int64_t budget_mb = 256) {
  EngineConfig config;
  config.workspace_bytes = budget_mb << 20;
  config.devices = std::move(devices);
  return ShardedEngine::Create(config);
}

TEST(VocabShardsTest, RowsAreSplitInMultiplesOfFourWithTheRestLast) {
  EXPECT_EQ(VocabShards::Split(1009, 3).begin, (std::vector<int64_t>{0, 340, 680, 1009}));
  EXPECT_EQ(VocabShards::Split(1024, 2).begin, (std::vector<int64_t>{0, 512, 1024}));
  // Smaller than four rows a shard: trailing shards are empty.
  EXPECT_EQ(VocabShards::Split(3, 2).begin, (std::vector<int64_t>{0, 3, 3}));
  EXPECT_EQ(VocabShards::Split(9, 3).begin, (std::vector<int64_t>{0, 4, 8, 9}));
  const VocabShards s = VocabShards::Split(1009, 3);
  EXPECT_EQ(s.ShardOf(0), 0);
  EXPECT_EQ(s.ShardOf(339), 0);
  EXPECT_EQ(s.ShardOf(340), 1);
  EXPECT_EQ(s.ShardOf(1008), 2);
  // Pieces of the weight's elements (H = 10) straddling both boundaries.
  std::vector<std::vector<int64_t>> pieces;
  ASSERT_TRUE(s.ForEachPiece(10, 3395, 3420, [&](int shard, int64_t at, int64_t n, int64_t done) {
                 pieces.push_back({shard, at, n, done});
                 return absl::OkStatus();
               }).ok());
  EXPECT_EQ(pieces, (std::vector<std::vector<int64_t>>{
                        {0, 3395, 5, 0}, {1, 0, 3400, 5}, {2, 0, 15, 3405}}));
}

TEST(ShardedEngineTest, NaiveIsRefusedAndFuseMNRunsVocabSplit) {
  auto engine = MakeSharded({0, 0});
  SKIP_WITHOUT_GPU(engine);
  ProblemSpec ps;
  ps.vocab_size = 517;
  Problem problem = MakeProblem(ps);
  absl::StatusOr<EngineRun> naive = RunProblem(**engine, problem, AllOutputsSpec(Strategy::kNaive), {});
  ASSERT_FALSE(naive.ok());
  EXPECT_EQ(naive.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(naive.status().message()).find("one GPU only"), std::string::npos)
      << naive.status();
  absl::StatusOr<EngineRun> fuse = RunProblem(**engine, problem, AllOutputsSpec(Strategy::kFuseMN), {});
  ASSERT_TRUE(fuse.ok()) << fuse.status();
  EXPECT_EQ(fuse->result.strategy_used, "vocab_split");
  // fuse_mn's tile kernel has no sharded form: the report names what ran.
  EXPECT_EQ(fuse->result.kernels.rfind("logits=cublas_fp32_splits rows=online_softmax+shard_merge",
                                       0),
            0u)
      << fuse->result.kernels;
  const ReferenceOutput ref = ComputeReference(MakeReferenceInput(problem, AllOutputsSpec(Strategy::kFuseMN)));
  EXPECT_LE(RelativeError({fuse->result.loss}, {ref.loss}), 1e-4);
}

// The same problem on one GPU and split in three: the per-token outputs and
// gradients agree to fp32 rounding (the sums run in another order), and the
// sharded call is bitwise repeatable with deterministic.
TEST(ShardedEngineTest, ThreeShardsMatchOneGpuAndRepeatBitForBit) {
  auto single = MakeEngine(256);
  SKIP_WITHOUT_GPU(single);
  auto sharded = MakeSharded({0, 0, 0});
  ASSERT_TRUE(sharded.ok()) << sharded.status();
  ProblemSpec ps;
  ps.vocab_size = 4099;
  ps.hidden_size = 96;
  ps.num_tokens = 300;
  ps.has_bias = true;
  ps.head_dtype = DType::kBF16;
  ps.hidden_dtype = DType::kBF16;
  Problem problem = MakeProblem(ps);
  for (Strategy strategy : {Strategy::kChunked, Strategy::kVocabSplit}) {
    SCOPED_TRACE(StrategyName(strategy));
    ComputeSpec spec = AllOutputsSpec(strategy);
    spec.deterministic = true;
    spec.options.label_smoothing = 0.1f;
    spec.options.z_loss_scale = 1e-4f;
    HarnessOptions options;
    options.seed = 7;
    absl::StatusOr<EngineRun> one = RunProblem(**single, problem, spec, options);
    absl::StatusOr<EngineRun> a = RunProblem(**sharded, problem, spec, options);
    absl::StatusOr<EngineRun> b = RunProblem(**sharded, problem, spec, options);
    ASSERT_TRUE(one.ok() && a.ok() && b.ok());
    EXPECT_LE(RelativeError({a->result.loss}, {one->result.loss}), 1e-5);
    EXPECT_LE(RelativeError(a->grad_weight, one->grad_weight), 1e-2);
    EXPECT_LE(RelativeError(a->grad_bias, one->grad_bias), 1e-2);
    EXPECT_LE(RelativeError(a->grad_input, one->grad_input), 1e-2);
    EXPECT_EQ(a->result.loss, b->result.loss);
    EXPECT_EQ(a->grad_input, b->grad_input);
    EXPECT_EQ(a->grad_weight, b->grad_weight);
    EXPECT_EQ(a->result.correct, one->result.correct);
  }
}

// The separate plan gives a split head a call's tokens in one block: more
// than a 2-D grid's 65535 rows must work (the row factors' kernel once
// refused them), and agree with one GPU's chunked plan.
TEST(ShardedEngineTest, SeparateTakesMoreThan65535TokensAtOnce) {
  auto single = MakeEngine(2048);
  SKIP_WITHOUT_GPU(single);
  auto sharded = MakeSharded({0, 0}, 2048);
  ASSERT_TRUE(sharded.ok()) << sharded.status();
  ProblemSpec ps;
  ps.vocab_size = 1003;
  ps.hidden_size = 64;
  ps.num_tokens = 65536 + 77;
  ps.head_dtype = DType::kBF16;
  ps.hidden_dtype = DType::kBF16;
  Problem problem = MakeProblem(ps);
  absl::StatusOr<EngineRun> split =
      RunProblem(**sharded, problem, AllOutputsSpec(Strategy::kSeparate), {});
  ASSERT_TRUE(split.ok()) << split.status();
  EXPECT_EQ(split->result.strategy_used, "separate");
  absl::StatusOr<EngineRun> one =
      RunProblem(**single, problem, AllOutputsSpec(Strategy::kChunked), {});
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_LE(RelativeError({split->result.loss}, {one->result.loss}), 1e-5);
  EXPECT_LE(RelativeError(split->grad_input, one->grad_input), 1e-2);
  EXPECT_LE(RelativeError(split->grad_weight, one->grad_weight), 1e-2);
  EXPECT_EQ(split->result.correct, one->result.correct);
}

// A collective that fails (as NCCL does when a peer GPU fails) from its
// `fail_from`-th use on.
class FailingCollective : public cuda::ShardCollective {
 public:
  FailingCollective(std::unique_ptr<cuda::ShardCollective> inner, int fail_from)
      : inner_(std::move(inner)), fail_from_(fail_from) {}
  const char* name() const override { return "failing"; }
  absl::Status AllGather(const std::vector<const void*>& send, const std::vector<void*>& recv,
                         int64_t bytes) override {
    if (++uses_ >= fail_from_) return absl::InternalError("ncclAllGather failed: injected");
    return inner_->AllGather(send, recv, bytes);
  }
  absl::Status SumToFirst(const std::vector<float*>& parts, int64_t count,
                          float* scratch) override {
    if (++uses_ >= fail_from_) return absl::InternalError("ncclSend failed: injected");
    return inner_->SumToFirst(parts, count, scratch);
  }
  void Heal() { fail_from_ = 1 << 30; }

 private:
  std::unique_ptr<cuda::ShardCollective> inner_;
  int fail_from_;
  int uses_ = 0;
};

// A collective's failure fails the call with its status, and the engine
// serves the next call as before.
TEST(ShardedEngineTest, ACollectiveFailureFailsTheCallAndTheEngineGoesOn) {
  auto probe = MakeEngine(256);
  SKIP_WITHOUT_GPU(probe);
  FailingCollective* failing = nullptr;
  EngineConfig config;
  config.workspace_bytes = int64_t{256} << 20;
  config.devices = {0, 0};
  auto engine = ShardedEngine::Create(
      config, [&](const std::vector<cuda::ShardLane>& lanes)
                  -> absl::StatusOr<std::unique_ptr<cuda::ShardCollective>> {
        auto f = std::make_unique<FailingCollective>(cuda::CreateDeviceCopyCollective(lanes), 2);
        failing = f.get();
        return std::unique_ptr<cuda::ShardCollective>(std::move(f));
      });
  ASSERT_TRUE(engine.ok()) << engine.status();
  ProblemSpec ps;
  ps.vocab_size = 1003;
  Problem problem = MakeProblem(ps);
  const ComputeSpec spec = AllOutputsSpec(Strategy::kChunked);
  absl::StatusOr<EngineRun> failed = RunProblem(**engine, problem, spec, {});
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kInternal);
  EXPECT_NE(std::string(failed.status().message()).find("ncclSend failed"), std::string::npos)
      << failed.status();
  EXPECT_TRUE((*engine)->healthy());
  failing->Heal();
  absl::StatusOr<EngineRun> run = RunProblem(**engine, problem, spec, {});
  ASSERT_TRUE(run.ok()) << run.status();
  const ReferenceOutput ref = ComputeReference(MakeReferenceInput(problem, spec));
  EXPECT_LE(RelativeError({run->result.loss}, {ref.loss}), 1e-4);
}

// NCCL between distinct GPUs: on a one-GPU host, one rank, which still loads
// the library, forms a communicator and runs the all-gather.
TEST(ShardedEngineTest, NcclWithOneRankComputesTheSameLoss) {
  auto single = MakeEngine(256);
  SKIP_WITHOUT_GPU(single);
  auto nccl = MakeSharded({0});
  if (!nccl.ok() && nccl.status().code() == absl::StatusCode::kUnavailable) {
    GTEST_SKIP() << "NCCL is not installed here: " << nccl.status().message();
  }
  ASSERT_TRUE(nccl.ok()) << nccl.status();
  EXPECT_NE((*nccl)->info().name.find("nccl"), std::string::npos) << (*nccl)->info().name;
  ProblemSpec ps;
  ps.vocab_size = 1003;
  Problem problem = MakeProblem(ps);
  const ComputeSpec spec = AllOutputsSpec(Strategy::kChunked);
  absl::StatusOr<EngineRun> one = RunProblem(**single, problem, spec, {});
  absl::StatusOr<EngineRun> run = RunProblem(**nccl, problem, spec, {});
  ASSERT_TRUE(one.ok() && run.ok());
  EXPECT_LE(RelativeError({run->result.loss}, {one->result.loss}), 1e-5);
  EXPECT_LE(RelativeError(run->grad_weight, one->grad_weight), 1e-4);
}

}  // namespace
}  // namespace flce::test
