// Training the head where it lives, through gRPC on the CPU engine:
// CreateOptimizer, GradNorm and Step, their idempotency, what they refuse,
// how they order with compute calls, and who may use them.
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/server/server_test_util.h"
#include "tests/support/reference_f64.h"

namespace flce::server::test {
namespace {

using ::flce::test::MakeProblem;
using ::testing::HasSubstr;

class TrainingTest : public ServerTest {
 protected:
  void SetUp() override {
    StartServer(TestConfig());
    problem_ = MakeProblem(TinyF32Spec());
    ASSERT_TRUE(UploadHead(stub(), "h", problem_).ok());
  }

  grpc::Status CreateSgd(double momentum = 0.0, bool replace = false,
                         v1::OptimizerInfo* info = nullptr) {
    v1::CreateOptimizerRequest request;
    request.set_head_id("h");
    request.set_kind(v1::OPTIMIZER_SGD);
    request.mutable_weight()->set_momentum(momentum);
    request.set_replace(replace);
    v1::OptimizerInfo ignored;
    grpc::ClientContext ctx;
    return stub().CreateOptimizer(&ctx, request, info != nullptr ? info : &ignored);
  }

  // StepHead with found_inf and expected_head_version.
  grpc::Status Step(const std::string& session, const std::string& request_id, double lr,
                    v1::StepResponse* response, bool found_inf = false,
                    std::optional<uint64_t> expected_version = std::nullopt) {
    v1::StepRequest request;
    request.set_head_id("h");
    request.set_session_id(session);
    request.set_request_id(request_id);
    request.set_lr(lr);
    request.set_found_inf(found_inf);
    if (expected_version) request.set_expected_head_version(*expected_version);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    return stub().Step(&ctx, request, response);
  }

  void ComputeIn(const std::string& session, const std::string& request_id,
                 v1::ComputeSummary* summary = nullptr) {
    ComputeOutcome out = Compute(stub(), MakeHeader(problem_, "h", session, request_id), problem_);
    ASSERT_TRUE(out.status.ok()) << out.status.error_message();
    if (summary != nullptr) *summary = out.summary;
  }

  v1::HeadInfo Describe() {
    v1::DescribeHeadRequest request;
    request.set_head_id("h");
    v1::HeadInfo info;
    grpc::ClientContext ctx;
    EXPECT_TRUE(stub().DescribeHead(&ctx, request, &info).ok());
    return info;
  }

  // The loss the head gives on the problem's data, by a forward-only call.
  double ForwardLoss() {
    v1::ComputeHeader header = MakeHeader(problem_, "h", "eval", "");
    header.mutable_outputs()->set_forward_only(true);
    ComputeOutcome out = Compute(stub(), header, problem_);
    EXPECT_TRUE(out.status.ok()) << out.status.error_message();
    return out.summary.loss();
  }

  double ReferenceLoss(const std::vector<double>& weight) {
    ComputeSpec spec;
    spec.reduction = Reduction::kSum;
    flce::test::ReferenceInput input = flce::test::MakeReferenceInput(problem_, spec);
    input.weight = weight;
    return flce::test::ComputeReference(input).loss;
  }

  Problem problem_;
};

TEST_F(TrainingTest, DownloadHeadGivesTheServedWeightOrItsMaster) {
  DownloadedHead plain = DownloadHead(stub(), "h", false, /*chunk_rows=*/10);
  ASSERT_TRUE(plain.status.ok()) << plain.status.error_message();
  EXPECT_EQ(plain.weight, problem_.weight);
  EXPECT_EQ(plain.chunks, 10);  // 97 rows, 10 per message
  // A bf16 head: its master is the weight widened until a step moves it.
  ProblemSpec spec = TinyF32Spec();
  spec.head_dtype = DType::kBF16;
  Problem bf16 = MakeProblem(spec);
  ASSERT_TRUE(UploadHead(stub(), "b", bf16).ok());
  DownloadedHead master = DownloadHead(stub(), "b", true);
  ASSERT_TRUE(master.status.ok()) << master.status.error_message();
  EXPECT_EQ(master.header.dtype(), v1::DTYPE_FP32);
  EXPECT_EQ(master.weight, bf16.weight);
  DownloadedHead missing = DownloadHead(stub(), "nope");
  EXPECT_EQ(missing.status.error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(TrainingTest, StepAppliesTheSessionGradientAndBumpsTheVersion) {
  v1::OptimizerInfo info;
  ASSERT_TRUE(CreateSgd(0.0, false, &info).ok());
  EXPECT_EQ(info.kind(), v1::OPTIMIZER_SGD);
  EXPECT_EQ(info.steps(), 0);
  EXPECT_EQ(info.state_bytes(), 0);  // fp32 head, no momentum: nothing beside the weight
  EXPECT_DOUBLE_EQ(info.weight().weight_decay(), 0.0);
  const uint64_t v0 = Describe().version();

  v1::ComputeSummary summary;
  ComputeIn("s", "c1", &summary);
  EXPECT_EQ(summary.head_version(), v0);
  FetchedGrad grad = FetchGrad(stub(), "h", "s");
  ASSERT_TRUE(grad.status.ok());

  // GradNorm is the fp64 sum of squares of what FetchGrad returns.
  v1::GradNormRequest norm_request;
  norm_request.set_head_id("h");
  norm_request.set_session_id("s");
  v1::GradNormResponse norm;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub().GradNorm(&ctx, norm_request, &norm).ok());
  }
  double want = 0.0;
  for (float g : grad.weight) want += static_cast<double>(g) * g;
  EXPECT_NEAR(norm.sq_norm(), want, 1e-12 * want);
  EXPECT_EQ(norm.contributions(), 1);
  EXPECT_EQ(norm.computed_on().oldest(), v0);
  EXPECT_EQ(norm.computed_on().newest(), v0);

  v1::StepResponse step;
  ASSERT_TRUE(Step("s", "step-1", 0.5, &step).ok());
  EXPECT_EQ(step.outcome(), v1::STEP_APPLIED);
  EXPECT_EQ(step.head_version(), v0 + 1);
  EXPECT_EQ(step.steps(), 1);
  EXPECT_EQ(step.contributions(), 1);
  EXPECT_FALSE(step.replayed());
  v1::HeadInfo head = Describe();
  EXPECT_EQ(head.version(), v0 + 1);
  EXPECT_EQ(head.optimizer().steps(), 1);

  // The session's gradient was consumed.
  FetchedGrad after = FetchGrad(stub(), "h", "s");
  ASSERT_TRUE(after.status.ok());
  EXPECT_EQ(after.header.contributions(), 0);
  for (float g : after.weight) ASSERT_EQ(g, 0.0f);

  // The head now serves W - lr * g, computed as the engine does in fp32.
  std::vector<float> want_w(problem_.weight.size());
  for (size_t i = 0; i < want_w.size(); ++i) {
    want_w[i] = problem_.weight[i] + (-0.5f) * grad.weight[i];
  }
  for (bool master : {false, true}) {
    DownloadedHead down = DownloadHead(stub(), "h", master);
    ASSERT_TRUE(down.status.ok()) << down.status.error_message();
    EXPECT_EQ(down.header.dtype(), v1::DTYPE_FP32);
    EXPECT_EQ(down.header.head().version(), v0 + 1);
    EXPECT_EQ(down.weight, want_w) << "master " << master;
  }
  // And a forward call's loss says so too.
  std::vector<double> stepped(problem_.weight.size());
  for (size_t i = 0; i < stepped.size(); ++i) {
    stepped[i] = static_cast<double>(problem_.weight[i] - 0.5f * grad.weight[i]);
  }
  const double loss = ForwardLoss();
  EXPECT_NEAR(loss, ReferenceLoss(stepped), 1e-5 * std::abs(loss));
  EXPECT_GT(std::abs(loss - ReferenceLoss(Doubles(problem_.weight))), 1e-3)
      << "the step did not change the served weight";
}

TEST_F(TrainingTest, ARepeatedStepAppliesOnce) {
  ASSERT_TRUE(CreateSgd().ok());
  ComputeIn("s", "c1");
  v1::StepResponse first, again;
  ASSERT_TRUE(Step("s", "run-step-0", 0.1, &first).ok());
  ComputeIn("s", "c2");  // a gradient the repeat must not apply
  ASSERT_TRUE(Step("s", "run-step-0", 0.1, &again).ok());
  EXPECT_TRUE(again.replayed());
  EXPECT_EQ(again.head_version(), first.head_version());
  EXPECT_EQ(again.steps(), 1);
  EXPECT_EQ(Describe().version(), first.head_version());
  FetchedGrad kept = FetchGrad(stub(), "h", "s");
  EXPECT_EQ(kept.header.contributions(), 1);
  // The same id with other values is refused, not replayed.
  v1::StepResponse other;
  grpc::Status status = Step("s", "run-step-0", 0.2, &other);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("other values"));
}

TEST_F(TrainingTest, FoundInfSkipsTheStepAndDropsTheGradient) {
  ASSERT_TRUE(CreateSgd().ok());
  const double loss_before = ForwardLoss();
  const uint64_t v0 = Describe().version();
  ComputeIn("s", "c1");
  v1::StepResponse step;
  ASSERT_TRUE(Step("s", "k", 0.5, &step, /*found_inf=*/true).ok());
  EXPECT_EQ(step.outcome(), v1::STEP_SKIPPED_FOUND_INF);
  EXPECT_EQ(step.head_version(), v0);
  EXPECT_EQ(step.steps(), 0);
  EXPECT_EQ(Describe().optimizer().skipped_steps(), 1);
  EXPECT_EQ(ForwardLoss(), loss_before);
  EXPECT_EQ(FetchGrad(stub(), "h", "s").header.contributions(), 0);
}

// As torch.optim skips a parameter whose grad is None: no weight decay, no
// moment update, no version bump when the session holds no contribution.
TEST_F(TrainingTest, AStepWithoutAGradientChangesNothing) {
  v1::CreateOptimizerRequest request;
  request.set_head_id("h");
  request.set_kind(v1::OPTIMIZER_ADAMW);
  request.mutable_weight()->set_weight_decay(0.5);
  v1::OptimizerInfo info;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub().CreateOptimizer(&ctx, request, &info).ok());
  }
  ComputeIn("s", "c1");
  v1::StepResponse first;
  ASSERT_TRUE(Step("s", "k1", 0.1, &first).ok());
  ASSERT_EQ(first.outcome(), v1::STEP_APPLIED);
  const double loss = ForwardLoss();
  v1::StepResponse second;
  ASSERT_TRUE(Step("s", "k2", 0.1, &second).ok());
  EXPECT_EQ(second.outcome(), v1::STEP_SKIPPED_NO_GRADIENT);
  EXPECT_EQ(second.head_version(), first.head_version());
  EXPECT_EQ(second.steps(), 1);
  EXPECT_EQ(second.contributions(), 0);
  EXPECT_EQ(ForwardLoss(), loss);
}

TEST_F(TrainingTest, AnUpdateThatWouldOverflowTheWeightIsSkipped) {
  ASSERT_TRUE(CreateSgd().ok());
  const double loss_before = ForwardLoss();
  ComputeIn("s", "c1");
  // Each factor is accepted, but lr x multiplier x g is beyond FLT_MAX.
  v1::StepRequest request;
  request.set_head_id("h");
  request.set_session_id("s");
  request.set_request_id("k");
  request.set_lr(1e30);
  request.set_grad_multiplier(1e12);
  v1::StepResponse step;
  grpc::ClientContext ctx;
  ASSERT_TRUE(stub().Step(&ctx, request, &step).ok());
  EXPECT_EQ(step.outcome(), v1::STEP_SKIPPED_NON_FINITE_WEIGHT);
  EXPECT_EQ(ForwardLoss(), loss_before);
}

TEST_F(TrainingTest, StepsAreRefusedWithAPreciseStatus) {
  v1::StepResponse step;
  ComputeIn("s", "c1");
  grpc::Status status = Step("s", "k0", 0.1, &step);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(status.error_message(), HasSubstr("CreateOptimizer first"));
  ASSERT_TRUE(CreateSgd().ok());

  status = CreateSgd();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::ALREADY_EXISTS) << status.error_message();
  EXPECT_TRUE(CreateSgd(0.9, /*replace=*/true).ok());

  status = Step("s", "", 0.1, &step);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  status = Step("s", "k1", -0.1, &step);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("Invalid learning rate: -0.1"));
  status = Step("s", "k2", std::nan(""), &step);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  // A session that never computed holds no gradient (torch's grad None): skipped.
  status = Step("nobody", "k3", 0.1, &step);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(step.outcome(), v1::STEP_SKIPPED_NO_GRADIENT);
  status = Step("s", "k4", 0.1, &step, false, /*expected_version=*/12345);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(status.error_message(), HasSubstr("expected_head_version = 12345"));

  // A staged contribution must be committed or discarded first.
  v1::ComputeHeader deferred = MakeHeader(problem_, "h", "s", "staged-1");
  deferred.set_commit(v1::COMMIT_DEFERRED);
  ASSERT_TRUE(Compute(stub(), deferred, problem_).status.ok());
  status = Step("s", "k5", 0.1, &step);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(status.error_message(), HasSubstr("1 staged contribution"));
  ASSERT_TRUE(Commit(stub(), "h", "s", "staged-1", 1.0f, false).ok());
  ASSERT_TRUE(Step("s", "k5", 0.1, &step).ok());
  EXPECT_EQ(step.contributions(), 2);

  // Hyper-parameters torch refuses, and parameters of the other kind.
  v1::CreateOptimizerRequest request;
  request.set_head_id("h");
  request.set_replace(true);
  request.set_kind(v1::OPTIMIZER_ADAMW);
  request.mutable_weight()->set_beta2(1.0);
  v1::OptimizerInfo info;
  {
    grpc::ClientContext ctx;
    status = stub().CreateOptimizer(&ctx, request, &info);
  }
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(status.error_message(), "weight group: Invalid beta parameter at index 1: 1");
  request.mutable_weight()->clear_beta2();
  request.mutable_weight()->set_momentum(0.9);
  {
    grpc::ClientContext ctx;
    status = stub().CreateOptimizer(&ctx, request, &info);
  }
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("momentum is not a parameter of adamw"));
  request.set_kind(static_cast<v1::OptimizerKind>(7));
  {
    grpc::ClientContext ctx;
    status = stub().CreateOptimizer(&ctx, request, &info);
  }
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("kind = 7 is not one of"));
  // The refused requests left the SGD state as it was.
  EXPECT_EQ(Describe().optimizer().kind(), v1::OPTIMIZER_SGD);
  EXPECT_EQ(Describe().optimizer().steps(), 1);
}

TEST_F(TrainingTest, ANewWeightNeedsResetOptimizer) {
  ASSERT_TRUE(CreateSgd(0.9).ok());
  grpc::Status status = UploadHead(stub(), "h", problem_);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(status.error_message(), HasSubstr("reset_optimizer"));
  EXPECT_TRUE(Describe().has_optimizer());
}

TEST_F(TrainingTest, OtherSessionsKeepTheirGradientsAndSayWhichVersion) {
  ASSERT_TRUE(CreateSgd().ok());
  const uint64_t v0 = Describe().version();
  ComputeIn("a", "a1");
  ComputeIn("b", "b1");
  v1::StepResponse step;
  ASSERT_TRUE(Step("a", "step-a", 0.1, &step).ok());
  FetchedGrad b = FetchGrad(stub(), "h", "b");
  ASSERT_TRUE(b.status.ok());
  EXPECT_EQ(b.header.contributions(), 1);
  EXPECT_EQ(b.header.head_version(), v0 + 1);
  EXPECT_EQ(b.header.computed_on().oldest(), v0);
  EXPECT_EQ(b.header.computed_on().newest(), v0);
  ComputeIn("b", "b2");
  b = FetchGrad(stub(), "h", "b");
  EXPECT_EQ(b.header.computed_on().oldest(), v0);
  EXPECT_EQ(b.header.computed_on().newest(), v0 + 1);
}

// A call in flight finishes on the weight it started with; the step waits
// for it, and a call arriving meanwhile waits for the step.
TEST_F(TrainingTest, ComputeCallsAndStepsDoNotOverlap) {
  ASSERT_TRUE(CreateSgd().ok());
  const uint64_t v0 = Describe().version();
  ComputeIn("s", "c1");
  std::atomic<bool> stepped{false};
  v1::StepResponse step;
  std::thread stepper;
  ComputeOptions options;
  options.pause_after_chunks = 1;
  options.on_pause = [&] {
    // The call holds the head once the server has made its session (that
    // comes after the gate): only then may the step start, else it would be
    // first by a race and the call would rightly wait for it.
    EXPECT_TRUE(WaitForSession(stub(), "other")) << "the call never reached the server";
    stepper = std::thread([&] {
      EXPECT_TRUE(Step("s", "k", 0.3, &step).ok());
      stepped = true;
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    EXPECT_FALSE(stepped.load()) << "the step did not wait for the call in flight";
  };
  ComputeOutcome in_flight =
      Compute(stub(), MakeHeader(problem_, "h", "other", "o1"), problem_, options);
  ASSERT_TRUE(in_flight.status.ok()) << in_flight.status.error_message();
  EXPECT_EQ(in_flight.summary.head_version(), v0);
  stepper.join();
  ASSERT_TRUE(stepped.load());
  EXPECT_EQ(step.outcome(), v1::STEP_APPLIED);
  v1::ComputeSummary later;
  ComputeIn("other", "o2", &later);
  EXPECT_EQ(later.head_version(), v0 + 1);
}

TEST_F(TrainingTest, ServerInfoAndMetricsShowTheOptimizer) {
  v1::ServerInfo info;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub().GetServerInfo(&ctx, v1::ServerInfoRequest(), &info).ok());
  }
  EXPECT_THAT(info.capabilities(), ::testing::Contains("optimizer"));
  EXPECT_FALSE(Describe().has_optimizer());
  ASSERT_TRUE(CreateSgd(0.9).ok());
  // fp32 head: the momentum buffer only.
  EXPECT_EQ(Describe().optimizer().state_bytes(),
            problem_.spec.vocab_size * problem_.spec.hidden_size * 4);
}

// Optimizer state counts against --max-head-bytes with the weights.
using TrainingLimitsTest = ServerTest;

TEST_F(TrainingLimitsTest, OptimizerStateCountsAgainstTheHeadMemoryCap) {
  Problem problem = MakeProblem(TinyF32Spec());
  ServerConfig config = TestConfig();
  const int64_t weight = problem.spec.vocab_size * problem.spec.hidden_size * 4;
  config.max_head_bytes = weight * 2;  // room for a momentum buffer, not AdamW's two moments
  StartServer(config);
  ASSERT_TRUE(UploadHead(stub(), "h", problem).ok());
  v1::CreateOptimizerRequest request;
  request.set_head_id("h");
  request.set_kind(v1::OPTIMIZER_ADAMW);
  v1::OptimizerInfo info;
  grpc::Status status;
  {
    grpc::ClientContext ctx;
    status = stub().CreateOptimizer(&ctx, request, &info);
  }
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(status.error_message(), HasSubstr("--max-head-bytes"));
  request.set_kind(v1::OPTIMIZER_SGD);
  request.mutable_weight()->set_momentum(0.9);
  {
    grpc::ClientContext ctx;
    status = stub().CreateOptimizer(&ctx, request, &info);
  }
  EXPECT_TRUE(status.ok()) << status.error_message();
}

// Optimizer state is the owner's: a tenant trains its own heads, an admin the
// shared ones; nobody else may create state, step or save it.
TEST_F(TrainingLimitsTest, OnlyTheOwnerTrainsAHead) {
  const std::string tokens = absl::StrCat(::testing::TempDir(), "/flce-training-tokens-", getpid());
  std::ofstream(tokens) << "tok-alice alice\ntok-ops ops admin\n";
  ServerConfig config = TestConfig();
  config.auth_token_file = tokens;
  StartServer(config);
  Problem problem = MakeProblem(TinyF32Spec());
  ASSERT_TRUE(UploadHead(stub(), "shared", problem, 3, nullptr, "tok-ops").ok());
  ASSERT_TRUE(UploadHead(stub(), "mine", problem, 3, nullptr, "tok-alice").ok());
  auto create = [&](const std::string& head, const std::string& token) {
    v1::CreateOptimizerRequest request;
    request.set_head_id(head);
    request.set_kind(v1::OPTIMIZER_SGD);
    v1::OptimizerInfo info;
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", absl::StrCat("Bearer ", token));
    return stub().CreateOptimizer(&ctx, request, &info);
  };
  grpc::Status status = create("shared", "tok-alice");
  EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(status.error_message(), HasSubstr("only an admin"));
  EXPECT_TRUE(create("shared", "tok-ops").ok());
  EXPECT_TRUE(create("mine", "tok-alice").ok());
  // A step on the shared head by the tenant is refused too.
  v1::StepRequest step;
  step.set_head_id("shared");
  step.set_request_id("k");
  step.set_lr(0.1);
  v1::StepResponse response;
  grpc::ClientContext ctx;
  ctx.AddMetadata("authorization", "Bearer tok-alice");
  EXPECT_EQ(stub().Step(&ctx, step, &response).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  std::remove(tokens.c_str());
}

}  // namespace
}  // namespace flce::server::test
