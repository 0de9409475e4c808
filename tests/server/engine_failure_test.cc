// An engine that loses its device: calls fail with UNAVAILABLE and the server
// stops with a non-OK status (main() then exits non-zero).
#include <atomic>
#include <memory>
#include <utility>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/engine_factory.h"
#include "tests/server/server_test_util.h"

namespace flce::server::test {
namespace {

using ::flce::test::MakeProblem;
using ::testing::HasSubstr;

// The CPU engine, until Break(): then every new call fails and healthy()
// turns false, as a sticky CUDA error would make it.
class BreakableEngine : public Engine {
 public:
  explicit BreakableEngine(std::unique_ptr<Engine> inner) : inner_(std::move(inner)) {}
  void Break() { broken_.store(true); }

  EngineInfo info() const override { return inner_->info(); }
  absl::StatusOr<std::unique_ptr<HeadBuilder>> BeginHead(const HeadSpec& spec) override {
    return inner_->BeginHead(spec);
  }
  absl::StatusOr<std::unique_ptr<GradBuffer>> NewGradBuffer(const HeadSpec& spec) override {
    if (broken_.load()) return absl::InternalError("device lost (simulated)");
    return inner_->NewGradBuffer(spec);
  }
  absl::StatusOr<std::unique_ptr<ComputeCall>> StartCompute(std::shared_ptr<const Head> head,
                                                            ComputeSpec spec,
                                                            GradInputSink sink) override {
    if (broken_.load()) return absl::InternalError("device lost (simulated)");
    return inner_->StartCompute(std::move(head), std::move(spec), std::move(sink));
  }
  absl::StatusOr<std::unique_ptr<HeadOptimizer>> CreateOptimizer(
      std::shared_ptr<const Head> head, const OptimizerConfig& config) override {
    return inner_->CreateOptimizer(std::move(head), config);
  }
  bool healthy() const override { return !broken_.load(); }

 private:
  std::unique_ptr<Engine> inner_;
  std::atomic<bool> broken_{false};
};

class EngineFailureTest : public ServerTest {};

TEST_F(EngineFailureTest, UnhealthyEngineFailsCallsAndStopsTheServer) {
  ServerConfig config = TestConfig();
  config.sweep_interval = absl::Milliseconds(50);
  EngineConfig engine_config;
  engine_config.threads = 2;
  auto cpu = CreateCpuEngine(engine_config);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  auto engine = std::make_unique<BreakableEngine>(std::move(*cpu));
  BreakableEngine* breakable = engine.get();
  StartServer(config, std::move(engine));

  ProblemSpec ps;
  ps.vocab_size = 64;
  ps.hidden_size = 8;
  ps.num_tokens = 10;
  Problem problem = MakeProblem(ps);
  ASSERT_TRUE(UploadHead(stub(), "h", problem).ok());
  ASSERT_TRUE(Compute(stub(), MakeHeader(problem, "h", "s", "ok"), problem).status.ok());

  breakable->Break();
  ComputeOutcome failed = Compute(stub(), MakeHeader(problem, "h", "s2", "broken"), problem);
  EXPECT_EQ(failed.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(failed.status.error_message(), HasSubstr("device lost"));

  absl::Status stopped = server().Wait();
  EXPECT_EQ(stopped.code(), absl::StatusCode::kUnavailable) << stopped;
}

}  // namespace
}  // namespace flce::server::test
