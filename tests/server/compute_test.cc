// Compute over loopback against the float64 reference, commits, idempotent
// retries, several sessions, cancellation and deadlines, head replacement in
// flight, and the server's limits.
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/server/server_test_util.h"
#include "tests/support/reference_f64.h"

namespace flce::server::test {
namespace {

using ::flce::test::ComputeReference;
using ::flce::test::MakeProblem;
using ::flce::test::MakeReferenceInput;
using ::flce::test::ReferenceOutput;
using ::flce::test::RelativeError;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr double kTol = 1e-5;  // MATH.md: CPU engine, fp32 inputs

ProblemSpec SmallSpec() {
  ProblemSpec ps;
  ps.vocab_size = 211;
  ps.hidden_size = 24;
  ps.num_tokens = 40;
  ps.head_dtype = DType::kF32;
  ps.hidden_dtype = DType::kF32;
  return ps;
}

// The reference of `header` (sum reduction unless set) on `problem`.
ReferenceOutput Reference(const Problem& problem, Reduction reduction = Reduction::kSum,
                          LossOptions options = {}) {
  ComputeSpec spec;
  spec.reduction = reduction;
  spec.options = options;
  return ComputeReference(MakeReferenceInput(problem, spec));
}

class ComputeTest : public ServerTest {};

TEST_F(ComputeTest, RoundTripMatchesFloat64Reference) {
  ServerConfig config = TestConfig();
  config.max_response_bytes = 64 << 10;  // grad_input must come back in several messages
  StartServer(config);
  ProblemSpec ps = SmallSpec();
  ps.num_tokens = 1500;
  ps.hidden_size = 40;
  ps.vocab_size = 1031;  // 165 KB of fp32 grad_W: several 64 KiB messages
  ps.has_bias = true;
  Problem problem = MakeProblem(ps);
  v1::HeadInfo info;
  ASSERT_TRUE(UploadHead(stub(), "h", problem, 3, &info).ok());
  EXPECT_EQ(info.version(), 1u);
  EXPECT_EQ(info.source(), "upload");

  v1::ComputeHeader header = MakeHeader(problem, "h", "s", "r1");
  header.set_reduction(v1::REDUCTION_MEAN);
  header.mutable_options()->set_label_smoothing(0.1f);
  header.mutable_options()->set_z_loss_scale(1e-3f);
  header.mutable_outputs()->set_per_token_loss(true);
  header.mutable_outputs()->set_logprob(true);
  header.mutable_outputs()->set_accuracy(true);
  ComputeOptions options;
  options.rows_per_chunk = 97;
  ComputeOutcome out = Compute(stub(), header, problem, options);
  ASSERT_TRUE(out.status.ok()) << out.status.error_message() << " seed " << problem.seed;
  ASSERT_TRUE(out.has_summary);

  LossOptions loss;
  loss.label_smoothing = 0.1f;
  loss.z_loss_scale = 1e-3f;
  ReferenceOutput ref = Reference(problem, Reduction::kMean, loss);
  EXPECT_NEAR(out.summary.loss(), ref.loss, kTol * std::abs(ref.loss)) << problem.seed;
  EXPECT_NEAR(out.summary.z_loss(), ref.z_loss, 1e-5 * std::abs(ref.z_loss) + 1e-9);
  EXPECT_EQ(out.summary.n_valid(), ref.n_valid);
  EXPECT_LE(std::abs(out.summary.n_correct() - ref.n_correct), ref.n_correct_uncertain);
  EXPECT_TRUE(out.summary.committed());
  EXPECT_FALSE(out.summary.replayed());
  EXPECT_EQ(out.summary.head_version(), 1u);
  EXPECT_EQ(out.summary.engine(), "cpu");
  EXPECT_EQ(out.summary.server_instance_id(), server().instance_id());
  EXPECT_FALSE(out.summary.strategy_used().empty());
  EXPECT_GT(out.summary.timings().total_ms(), 0.0);
  EXPECT_GT(out.grad_messages, 1) << "grad_input should be split to fit --max-response-mb";
  EXPECT_EQ(out.grad_rows, ps.num_tokens);
  EXPECT_LE(RelativeError(Doubles(out.grad_input), ref.grad_input), kTol) << problem.seed;

  // Token outputs cover every token once.
  std::vector<float> per_token(ps.num_tokens, std::nanf(""));
  std::vector<float> logprob(ps.num_tokens, std::nanf(""));
  for (const v1::TokenOutputsChunk& c : out.token_outputs) {
    ASSERT_EQ(c.loss().size(), c.num_tokens() * 4u);
    ASSERT_EQ(c.logprob().size(), c.num_tokens() * 4u);
    ASSERT_EQ(c.correct().size(), c.num_tokens() * 1u);
    std::memcpy(per_token.data() + c.token_offset(), c.loss().data(), c.loss().size());
    std::memcpy(logprob.data() + c.token_offset(), c.logprob().data(), c.logprob().size());
  }
  EXPECT_LE(RelativeError(Doubles(per_token), ref.per_token_loss), kTol);
  EXPECT_LE(RelativeError(Doubles(logprob), ref.logprob), kTol);

  FetchedGrad grad = FetchGrad(stub(), "h", "s");
  ASSERT_TRUE(grad.status.ok()) << grad.status.error_message();
  EXPECT_EQ(grad.header.contributions(), 1);
  EXPECT_EQ(grad.header.head_version(), 1u);
  EXPECT_LE(RelativeError(Doubles(grad.weight), ref.grad_weight), kTol);
  EXPECT_LE(RelativeError(Doubles(grad.bias), ref.grad_bias), kTol);
  EXPECT_GT(grad.chunks, 2) << "a V x H fp32 gradient should span several messages";

  // bf16 fetch: the same gradient rounded.
  FetchedGrad bf16 = FetchGrad(stub(), "h", "s", false, "", v1::DTYPE_BF16, 50);
  ASSERT_TRUE(bf16.status.ok());
  EXPECT_LE(RelativeError(Doubles(bf16.weight), ref.grad_weight), 4e-3);
}

TEST_F(ComputeTest, ForwardOnlyLeavesNoSessionAndNoGradInput) {
  StartServer(TestConfig());
  Problem problem = MakeProblem(SmallSpec());
  ASSERT_TRUE(UploadHead(stub(), "h", problem).ok());
  v1::ComputeHeader header = MakeHeader(problem, "h", "eval", "e1");
  header.mutable_outputs()->set_forward_only(true);
  ComputeOutcome out = Compute(stub(), header, problem);
  ASSERT_TRUE(out.status.ok()) << out.status.error_message();
  EXPECT_EQ(out.grad_messages, 0);
  EXPECT_NEAR(out.summary.loss(), Reference(problem).loss, kTol * std::abs(out.summary.loss()));
  EXPECT_FALSE(out.summary.committed());
  FetchedGrad grad = FetchGrad(stub(), "h", "eval");
  EXPECT_EQ(grad.status.error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(ComputeTest, DeferredCommitAppliesScale) {
  StartServer(TestConfig());
  Problem problem = MakeProblem(SmallSpec());
  ASSERT_TRUE(UploadHead(stub(), "h", problem).ok());
  ReferenceOutput ref = Reference(problem);
  v1::ComputeHeader header = MakeHeader(problem, "h", "s", "d1");
  header.set_commit(v1::COMMIT_DEFERRED);
  ComputeOutcome out = Compute(stub(), header, problem);
  ASSERT_TRUE(out.status.ok()) << out.status.error_message();
  EXPECT_TRUE(out.summary.staged());
  EXPECT_FALSE(out.summary.committed());

  // Staged, not yet in the accumulator.
  FetchedGrad before = FetchGrad(stub(), "h", "s");
  ASSERT_TRUE(before.status.ok());
  EXPECT_EQ(before.header.contributions(), 0);
  for (float g : before.weight) ASSERT_EQ(g, 0.0f);

  v1::CommitResponse commit;
  ASSERT_TRUE(Commit(stub(), "h", "s", "d1", 0.25f, false, &commit).ok());
  EXPECT_EQ(commit.state(), v1::CONTRIBUTION_COMMITTED);
  EXPECT_FALSE(commit.replayed());
  EXPECT_EQ(commit.scale(), 0.25f);
  FetchedGrad after = FetchGrad(stub(), "h", "s");
  EXPECT_EQ(after.header.contributions(), 1);
  EXPECT_LE(RelativeError(Doubles(after.weight), Scaled(ref.grad_weight, 0.25)), kTol);
}

TEST_F(ComputeTest, DiscardDropsTheStagedContribution) {
  StartServer(TestConfig());
  Problem problem = MakeProblem(SmallSpec());
  ASSERT_TRUE(UploadHead(stub(), "h", problem).ok());
  v1::ComputeHeader header = MakeHeader(problem, "h", "s", "d1");
  header.set_commit(v1::COMMIT_DEFERRED);
  ASSERT_TRUE(Compute(stub(), header, problem).status.ok());
  v1::CommitResponse discard;
  ASSERT_TRUE(Commit(stub(), "h", "s", "d1", 1.0f, true, &discard).ok());
  EXPECT_EQ(discard.state(), v1::CONTRIBUTION_DISCARDED);
  FetchedGrad grad = FetchGrad(stub(), "h", "s");
  EXPECT_EQ(grad.header.contributions(), 0);
  for (float g : grad.weight) ASSERT_EQ(g, 0.0f);
  // A commit after the discard answers with the first outcome.
  v1::CommitResponse again;
  ASSERT_TRUE(Commit(stub(), "h", "s", "d1", 1.0f, false, &again).ok());
  EXPECT_EQ(again.state(), v1::CONTRIBUTION_DISCARDED);
  EXPECT_TRUE(again.replayed());
  // Unknown request id: NOT_FOUND naming it.
  grpc::Status unknown = Commit(stub(), "h", "s", "nope", 1.0f, false);
  EXPECT_EQ(unknown.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(unknown.error_message(), HasSubstr("nope"));
}

TEST_F(ComputeTest, RepeatedComputeIsReplayedNotAppliedTwice) {
  StartServer(TestConfig());
  Problem problem = MakeProblem(SmallSpec());
  ASSERT_TRUE(UploadHead(stub(), "h", problem).ok());
  ReferenceOutput ref = Reference(problem);
  v1::ComputeHeader header = MakeHeader(problem, "h", "s", "same");
  ComputeOutcome first = Compute(stub(), header, problem);
  ASSERT_TRUE(first.status.ok()) << first.status.error_message();
  ComputeOutcome second = Compute(stub(), header, problem);
  ASSERT_TRUE(second.status.ok()) << second.status.error_message();
  EXPECT_FALSE(first.summary.replayed());
  EXPECT_TRUE(second.summary.replayed());
  EXPECT_TRUE(second.summary.committed());
  EXPECT_DOUBLE_EQ(second.summary.loss(), first.summary.loss());
  EXPECT_LE(RelativeError(Doubles(second.grad_input), ref.grad_input), kTol);
  FetchedGrad grad = FetchGrad(stub(), "h", "s");
  EXPECT_EQ(grad.header.contributions(), 1);
  EXPECT_LE(RelativeError(Doubles(grad.weight), ref.grad_weight), kTol);
}

TEST_F(ComputeTest, RepeatedCommitReturnsFirstOutcome) {
  StartServer(TestConfig());
  Problem problem = MakeProblem(SmallSpec());
  ASSERT_TRUE(UploadHead(stub(), "h", problem).ok());
  ReferenceOutput ref = Reference(problem);
  v1::ComputeHeader header = MakeHeader(problem, "h", "s", "c1");
  header.set_commit(v1::COMMIT_DEFERRED);
  ASSERT_TRUE(Compute(stub(), header, problem).status.ok());
  v1::CommitResponse first, second;
  ASSERT_TRUE(Commit(stub(), "h", "s", "c1", 2.0f, false, &first).ok());
  ASSERT_TRUE(Commit(stub(), "h", "s", "c1", 5.0f, false, &second).ok());
  EXPECT_FALSE(first.replayed());
  EXPECT_TRUE(second.replayed());
  EXPECT_EQ(second.state(), v1::CONTRIBUTION_COMMITTED);
  EXPECT_EQ(second.scale(), 2.0f);
  FetchedGrad grad = FetchGrad(stub(), "h", "s");
  EXPECT_EQ(grad.header.contributions(), 1);
  EXPECT_LE(RelativeError(Doubles(grad.weight), Scaled(ref.grad_weight, 2.0)), kTol);
}

TEST_F(ComputeTest, RepeatedFetchWithResetReturnsTheSameGradient) {
  StartServer(TestConfig());
  Problem problem = MakeProblem(SmallSpec());
  ASSERT_TRUE(UploadHead(stub(), "h", problem).ok());
  ReferenceOutput ref = Reference(problem);
  ASSERT_TRUE(Compute(stub(), MakeHeader(problem, "h", "s", "r1"), problem).status.ok());
  FetchedGrad first = FetchGrad(stub(), "h", "s", true, "f1");
  ASSERT_TRUE(first.status.ok());
  EXPECT_FALSE(first.header.replayed());
  EXPECT_LE(RelativeError(Doubles(first.weight), ref.grad_weight), kTol);
  FetchedGrad retry = FetchGrad(stub(), "h", "s", true, "f1");
  ASSERT_TRUE(retry.status.ok());
  EXPECT_TRUE(retry.header.replayed());
  EXPECT_EQ(retry.header.contributions(), 1);
  EXPECT_EQ(retry.weight, first.weight);
  // The accumulator itself was reset once.
  FetchedGrad now = FetchGrad(stub(), "h", "s");
  EXPECT_EQ(now.header.contributions(), 0);
  for (float g : now.weight) ASSERT_EQ(g, 0.0f);
  // A new reset id resets again (nothing accumulated since: zeros).
  FetchedGrad next = FetchGrad(stub(), "h", "s", true, "f2");
  EXPECT_FALSE(next.header.replayed());
  for (float g : next.weight) ASSERT_EQ(g, 0.0f);
}

v1::SessionInfo SessionNamed(v1::Flce::Stub &stub, const std::string &session_id) {
  grpc::ClientContext context;
  v1::ListSessionsResponse sessions;
  EXPECT_TRUE(stub.ListSessions(&context, v1::ListSessionsRequest(), &sessions).ok());
  for (const v1::SessionInfo &s : sessions.sessions()) {
    if (s.session_id() == session_id) return s;
  }
  ADD_FAILURE() << "no session " << session_id;
  return {};
}

TEST_F(ComputeTest, RetryOfAnOlderResetIsRefusedNotResetAgain) {
  StartServer(TestConfig());
  Problem problem = MakeProblem(SmallSpec());
  ASSERT_TRUE(UploadHead(stub(), "h", problem).ok());
  ASSERT_TRUE(Compute(stub(), MakeHeader(problem, "h", "s", "r1"), problem).status.ok());
  ASSERT_TRUE(FetchGrad(stub(), "h", "s", true, "f1").status.ok());
  ASSERT_TRUE(Compute(stub(), MakeHeader(problem, "h", "s", "r2"), problem).status.ok());
  ASSERT_TRUE(FetchGrad(stub(), "h", "s", true, "f2").status.ok());
  ASSERT_TRUE(Compute(stub(), MakeHeader(problem, "h", "s", "r3"), problem).status.ok());
  // f1's gradient is gone (f2 replaced it): its retry must not reset r3's.
  FetchedGrad old = FetchGrad(stub(), "h", "s", true, "f1");
  EXPECT_EQ(old.status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(old.status.error_message(), HasSubstr("f1"));
  FetchedGrad now = FetchGrad(stub(), "h", "s");
  EXPECT_EQ(now.header.contributions(), 1);
  // The latest reset is still replayed.
  FetchedGrad latest = FetchGrad(stub(), "h", "s", true, "f2");
  ASSERT_TRUE(latest.status.ok());
  EXPECT_TRUE(latest.header.replayed());
}

TEST_F(ComputeTest, ConcurrentRetriesOfOneResetResetOnce) {
  StartServer(TestConfig());
  Problem problem = MakeProblem(SmallSpec());
  ASSERT_TRUE(UploadHead(stub(), "h", problem).ok());
  for (int round = 0; round < 5; ++round) {
    const std::string id = absl::StrCat("f", round);
    ASSERT_TRUE(Compute(stub(), MakeHeader(problem, "h", "s", absl::StrCat("r", round)), problem)
                    .status.ok());
    std::vector<FetchedGrad> got(4);
    std::vector<std::thread> threads;
    for (auto &g : got)
      threads.emplace_back([&, id] { g = FetchGrad(stub(), "h", "s", true, id); });
    for (auto &t : threads) t.join();
    int fresh = 0;
    for (const FetchedGrad &g : got) {
      ASSERT_TRUE(g.status.ok()) << g.status.error_message();
      EXPECT_EQ(g.header.contributions(), 1);
      EXPECT_EQ(g.weight, got[0].weight);
      fresh += g.header.replayed() ? 0 : 1;
    }
    EXPECT_EQ(fresh, 1);
  }
}

TEST_F(ComputeTest, SavedResetGradientIsCountedAndFreedByZeroGrad) {
  StartServer(TestConfig());
  Problem problem = MakeProblem(SmallSpec());
  ASSERT_TRUE(UploadHead(stub(), "h", problem).ok());
  ASSERT_TRUE(Compute(stub(), MakeHeader(problem, "h", "s", "r1"), problem).status.ok());
  const int64_t one = SessionNamed(stub(), "s").grad_bytes();
  ASSERT_TRUE(FetchGrad(stub(), "h", "s", true, "f1").status.ok());
  EXPECT_EQ(SessionNamed(stub(), "s").grad_bytes(), 2 * one);
  grpc::ClientContext context;
  v1::ZeroGradRequest zero;
  zero.set_head_id("h");
  zero.set_session_id("s");
  v1::ZeroGradResponse zeroed;
  ASSERT_TRUE(stub().ZeroGrad(&context, zero, &zeroed).ok());
  EXPECT_EQ(SessionNamed(stub(), "s").grad_bytes(), one);
  // Its gradient is gone: the retry is refused rather than resetting again.
  EXPECT_EQ(FetchGrad(stub(), "h", "s", true, "f1").status.error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
}

// A client that never reads its grad_input and whose deadline passes while
// the server is still writing it: the contribution must not land (it used
// to be committed, or staged and holding a --max-pending slot, before the
// outputs were written).
void RunCallThatNeverReads(v1::Flce::Stub &stub, const Problem &problem,
                           const v1::ComputeHeader &header) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(1500));
  auto stream = stub.Compute(&context);
  ASSERT_TRUE(stream->Write(HeaderMessage(header)));
  const int64_t row_bytes =
      static_cast<int64_t>(problem.hidden_bytes.size()) / problem.spec.num_tokens;
  const int64_t rows = 2048;
  for (int64_t t = 0; t < problem.spec.num_tokens; t += rows) {
    if (!stream->Write(
            HiddenMessage(t, problem.hidden_bytes.substr(t * row_bytes, rows * row_bytes)))) {
      break;
    }
  }
  stream->Write(EndMessage(problem.spec.num_tokens));
  stream->WritesDone();
  std::this_thread::sleep_for(std::chrono::milliseconds(2000));  // past the deadline, unread
  grpc::Status status = stream->Finish();
  EXPECT_FALSE(status.ok());
}

TEST_F(ComputeTest, ClientGoneBeforeItsOutputsAreWrittenCommitsAndStagesNothing) {
  StartServer(TestConfig());
  ProblemSpec ps = SmallSpec();
  ps.vocab_size = 97;
  ps.hidden_size = 512;
  ps.num_tokens = 16384;  // 32 MiB of fp32 grad_input: more than the transport buffers
  Problem problem = MakeProblem(ps);
  ASSERT_TRUE(UploadHead(stub(), "h", problem).ok());
  RunCallThatNeverReads(stub(), problem, MakeHeader(problem, "h", "s", "gone-1"));
  v1::ComputeHeader deferred = MakeHeader(problem, "h", "s", "gone-2");
  deferred.set_commit(v1::COMMIT_DEFERRED);
  RunCallThatNeverReads(stub(), problem, deferred);
  for (int i = 0; i < 200 && SessionNamed(stub(), "s").pending() > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(SessionNamed(stub(), "s").pending(), 0);
  FetchedGrad grad = FetchGrad(stub(), "h", "s");
  ASSERT_TRUE(grad.status.ok());
  EXPECT_EQ(grad.header.contributions(), 0);
  for (float g : grad.weight) ASSERT_EQ(g, 0.0f);
}

TEST_F(ComputeTest, ReusedRequestIdWithOtherDataIsRefused) {
  StartServer(TestConfig());
  Problem problem = MakeProblem(SmallSpec());
  ASSERT_TRUE(UploadHead(stub(), "h", problem).ok());
  v1::ComputeHeader header = MakeHeader(problem, "h", "s", "r1");
  ASSERT_TRUE(Compute(stub(), header, problem).status.ok());
  // Same call, other strategy and outputs: a replay.
  v1::ComputeHeader retry = header;
  retry.set_strategy(v1::STRATEGY_CHUNKED);
  retry.mutable_outputs()->set_per_token_loss(true);
  ComputeOutcome replay = Compute(stub(), retry, problem);
  ASSERT_TRUE(replay.status.ok());
  EXPECT_TRUE(replay.summary.replayed());
  // Other targets under the same id: refused, not "replayed".
  std::string targets = header.targets();
  int32_t first = 0;
  std::memcpy(&first, targets.data(), 4);
  first = first == 0 ? 1 : 0;
  std::memcpy(targets.data(), &first, 4);
  v1::ComputeHeader changed = header;
  changed.set_targets(targets);
  ComputeOutcome refused = Compute(stub(), changed, problem);
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(refused.status.error_message(),
              HasSubstr("request id \"r1\" was used for a different request"));
  EXPECT_EQ(FetchGrad(stub(), "h", "s").header.contributions(), 1);
}

TEST_F(ComputeTest, HiddenSizeOtherThanTheHeadsIsNamed) {
  StartServer(TestConfig());
  Problem problem = MakeProblem(SmallSpec());
  ASSERT_TRUE(UploadHead(stub(), "h", problem).ok());
  v1::ComputeHeader header = MakeHeader(problem, "h", "s", "w1");
  header.set_hidden_size(problem.spec.hidden_size + 1);
  ComputeOutcome outcome = Compute(stub(), header, problem);
  EXPECT_EQ(outcome.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(outcome.status.error_message(),
              AllOf(HasSubstr(absl::StrCat("hidden_size = ", problem.spec.hidden_size + 1)),
                    HasSubstr(absl::StrCat("head's hidden_size is ", problem.spec.hidden_size))));
  header.set_hidden_size(problem.spec.hidden_size);
  EXPECT_TRUE(Compute(stub(), header, problem).status.ok());
}

TEST_F(ComputeTest, CommitWithoutAScaleAppliesOne) {
  StartServer(TestConfig());
  Problem problem = MakeProblem(SmallSpec());
  ASSERT_TRUE(UploadHead(stub(), "h", problem).ok());
  ReferenceOutput ref = Reference(problem);
  v1::ComputeHeader header = MakeHeader(problem, "h", "s", "d1");
  header.set_commit(v1::COMMIT_DEFERRED);
  ASSERT_TRUE(Compute(stub(), header, problem).status.ok());
  grpc::ClientContext context;
  v1::CommitRequest request;  // no scale
  request.set_head_id("h");
  request.set_session_id("s");
  request.set_request_id("d1");
  v1::CommitResponse response;
  ASSERT_TRUE(stub().Commit(&context, request, &response).ok());
  EXPECT_EQ(response.scale(), 1.0f);
  FetchedGrad grad = FetchGrad(stub(), "h", "s");
  EXPECT_LE(RelativeError(Doubles(grad.weight), ref.grad_weight), kTol);
}

// wait_ms is the time a call waited for the engine while another call's
// chunks ran, not the time StartCompute took.
TEST_F(ComputeTest, WaitMsCountsTheTimeSpentWaitingForTheEngine) {
  StartServer(TestConfig());
  ProblemSpec ps = SmallSpec();
  ps.vocab_size = 1000;
  ps.hidden_size = 128;
  ps.num_tokens = 1024;
  Problem problem = MakeProblem(ps);
  ASSERT_TRUE(UploadHead(stub(), "h", problem).ok());
  std::vector<ComputeOutcome> outcomes(2);
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i) {
    threads.emplace_back([&, i] {
      v1::ComputeHeader header = MakeHeader(problem, "h", absl::StrCat("s", i), "r");
      header.set_chunk_tokens(32);
      ComputeOptions options;
      options.rows_per_chunk = 64;
      outcomes[i] = Compute(stub(), header, problem, options);
    });
  }
  for (auto &t : threads) t.join();
  double waited = 0.0;
  for (const ComputeOutcome &out : outcomes) {
    ASSERT_TRUE(out.status.ok()) << out.status.error_message();
    const v1::Timings &timings = out.summary.timings();
    EXPECT_LE(timings.wait_ms() + timings.engine_ms(), timings.total_ms());
    waited += timings.wait_ms();
  }
  EXPECT_GT(waited, 0.0);
}

TEST_F(ComputeTest, ZeroGradClearsTheAccumulator) {
  StartServer(TestConfig());
  Problem problem = MakeProblem(SmallSpec());
  ASSERT_TRUE(UploadHead(stub(), "h", problem).ok());
  ASSERT_TRUE(Compute(stub(), MakeHeader(problem, "h", "s", "r1"), problem).status.ok());
  FetchedGrad before = FetchGrad(stub(), "h", "s");
  ASSERT_EQ(before.header.contributions(), 1);
  grpc::ClientContext context;
  v1::ZeroGradRequest request;
  request.set_head_id("h");
  request.set_session_id("s");
  v1::ZeroGradResponse response;
  ASSERT_TRUE(stub().ZeroGrad(&context, request, &response).ok());
  FetchedGrad after = FetchGrad(stub(), "h", "s");
  EXPECT_EQ(after.header.contributions(), 0);
  for (float g : after.weight) ASSERT_EQ(g, 0.0f);
  // Accumulation starts again from zero.
  ASSERT_TRUE(Compute(stub(), MakeHeader(problem, "h", "s", "r2"), problem).status.ok());
  FetchedGrad again = FetchGrad(stub(), "h", "s");
  EXPECT_LE(RelativeError(Doubles(again.weight), Doubles(before.weight)), 1e-6);
}

TEST_F(ComputeTest, SeveralSessionsAccumulateExactly) {
  ServerConfig config = TestConfig();
  config.max_pending = 4;
  StartServer(config);
  Problem problem = MakeProblem(SmallSpec());
  ASSERT_TRUE(UploadHead(stub(), "h", problem).ok());
  ReferenceOutput ref = Reference(problem);
  constexpr int kSessions = 3;
  constexpr int kCalls = 3;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int s = 0; s < kSessions; ++s) {
    threads.emplace_back([&, s] {
      // Session s gets kCalls x (s + 1) calls in turn; sessions run at once.
      for (int c = 0; c < kCalls * (s + 1); ++c) {
        v1::ComputeHeader header =
            MakeHeader(problem, "h", absl::StrCat("s", s), absl::StrCat("r", s, "-", c));
        ComputeOutcome out = Compute(stub(), header, problem);
        if (!out.status.ok()) ++failures;
      }
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_EQ(failures.load(), 0);
  for (int s = 0; s < kSessions; ++s) {
    FetchedGrad grad = FetchGrad(stub(), "h", absl::StrCat("s", s));
    ASSERT_TRUE(grad.status.ok());
    int calls = kCalls * (s + 1);
    EXPECT_EQ(grad.header.contributions(), calls);
    EXPECT_LE(RelativeError(Doubles(grad.weight), Scaled(ref.grad_weight, calls)), kTol)
        << "session s" << s;
  }
  grpc::ClientContext context;
  v1::ListSessionsRequest request;
  request.set_head_id("h");
  v1::ListSessionsResponse sessions;
  ASSERT_TRUE(stub().ListSessions(&context, request, &sessions).ok());
  EXPECT_EQ(sessions.sessions_size(), kSessions);
  for (const v1::SessionInfo& info : sessions.sessions()) {
    EXPECT_EQ(info.pending(), 0);
    EXPECT_EQ(info.tokens() % problem.spec.num_tokens, 0);
  }
}

// Polls ListSessions until the session shows no pending contribution: the
// worker of a cancelled call cleans up after the client saw its status.
void ExpectNoPending(v1::Flce::Stub& stub, const std::string& session) {
  for (int i = 0; i < 100; ++i) {
    grpc::ClientContext context;
    v1::ListSessionsResponse sessions;
    ASSERT_TRUE(stub.ListSessions(&context, v1::ListSessionsRequest(), &sessions).ok());
    bool pending = false;
    for (const auto& s : sessions.sessions()) {
      if (s.session_id() == session && s.pending() > 0) pending = true;
    }
    if (!pending) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ADD_FAILURE() << "session " << session << " still has a pending contribution";
}

TEST_F(ComputeTest, ClientCancelMidwayLeavesGradUnchanged) {
  StartServer(TestConfig());
  Problem problem = MakeProblem(SmallSpec());
  ASSERT_TRUE(UploadHead(stub(), "h", problem).ok());
  ASSERT_TRUE(Compute(stub(), MakeHeader(problem, "h", "s", "ok1"), problem).status.ok());
  FetchedGrad before = FetchGrad(stub(), "h", "s");
  ComputeOptions options;
  options.pause_after_chunks = 2;
  options.cancel_at_pause = true;
  options.on_pause = [] { std::this_thread::sleep_for(std::chrono::milliseconds(50)); };
  ComputeOutcome out =
      Compute(stub(), MakeHeader(problem, "h", "s", "cancelled"), problem, options);
  EXPECT_EQ(out.status.error_code(), grpc::StatusCode::CANCELLED);
  ExpectNoPending(stub(), "s");
  FetchedGrad after = FetchGrad(stub(), "h", "s");
  EXPECT_EQ(after.weight, before.weight);
  EXPECT_EQ(after.header.contributions(), 1);
  // The cancelled request id was never applied: running it again applies it.
  ComputeOutcome retry = Compute(stub(), MakeHeader(problem, "h", "s", "cancelled"), problem);
  ASSERT_TRUE(retry.status.ok()) << retry.status.error_message();
  EXPECT_FALSE(retry.summary.replayed());
}

TEST_F(ComputeTest, DeadlinePassingMidwayLeavesGradUnchanged) {
  StartServer(TestConfig());
  Problem problem = MakeProblem(SmallSpec());
  ASSERT_TRUE(UploadHead(stub(), "h", problem).ok());
  ASSERT_TRUE(Compute(stub(), MakeHeader(problem, "h", "s", "ok1"), problem).status.ok());
  FetchedGrad before = FetchGrad(stub(), "h", "s");
  ComputeOptions options;
  options.deadline = std::chrono::milliseconds(300);
  options.pause_after_chunks = 2;
  options.on_pause = [] { std::this_thread::sleep_for(std::chrono::milliseconds(600)); };
  ComputeOutcome out = Compute(stub(), MakeHeader(problem, "h", "s", "late"), problem, options);
  EXPECT_EQ(out.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  ExpectNoPending(stub(), "s");
  FetchedGrad after = FetchGrad(stub(), "h", "s");
  EXPECT_EQ(after.weight, before.weight);
  EXPECT_EQ(after.header.contributions(), 1);
}

TEST_F(ComputeTest, HeadReplacedWhileCallInFlightFinishesOnOldHead) {
  StartServer(TestConfig());
  ProblemSpec ps = SmallSpec();
  Problem old_head = MakeProblem(ps);
  ASSERT_TRUE(UploadHead(stub(), "h", old_head).ok());
  Problem new_head = MakeProblem(ps);  // same shape, other weights
  ReferenceOutput ref_old = Reference(old_head);

  ComputeOptions options;
  options.pause_after_chunks = 2;
  grpc::Status replaced;
  v1::HeadInfo replaced_info;
  options.on_pause = [&] {
    ASSERT_TRUE(WaitForPending(stub(), "s", 1));  // the call took its head snapshot
    replaced = UploadHead(stub(), "h", new_head, 2, &replaced_info);
  };
  ComputeOutcome out = Compute(stub(), MakeHeader(old_head, "h", "s", "r1"), old_head, options);
  ASSERT_TRUE(replaced.ok()) << replaced.error_message();
  EXPECT_EQ(replaced_info.version(), 2u);
  EXPECT_EQ(replaced_info.sessions(), 1) << "sessions are kept across a replacement";
  ASSERT_TRUE(out.status.ok()) << out.status.error_message();
  EXPECT_EQ(out.summary.head_version(), 1u);
  EXPECT_NEAR(out.summary.loss(), ref_old.loss, kTol * std::abs(ref_old.loss));
  EXPECT_LE(RelativeError(Doubles(out.grad_input), ref_old.grad_input), kTol);

  // The next call runs on version 2 (hidden/targets of old_head on new W).
  Problem mixed = new_head;
  mixed.hidden = old_head.hidden;
  mixed.hidden_bytes = old_head.hidden_bytes;
  mixed.targets = old_head.targets;
  ComputeOutcome next = Compute(stub(), MakeHeader(old_head, "h", "s", "r2"), old_head);
  ASSERT_TRUE(next.status.ok());
  EXPECT_EQ(next.summary.head_version(), 2u);
  EXPECT_NEAR(next.summary.loss(), Reference(mixed).loss, kTol * std::abs(next.summary.loss()));
}

TEST_F(ComputeTest, ClientThatDoesNotReadStallsTheUploadInsteadOfFillingMemory) {
  ServerConfig config = TestConfig();
  config.max_message_bytes = 1 << 20;  // the server buffers at most 16 MiB of output
  StartServer(config);
  ProblemSpec ps;
  ps.vocab_size = 16;
  ps.hidden_size = 512;
  ps.num_tokens = 32768;  // 64 MiB of fp32 hidden in, as much grad_input out
  ps.head_dtype = DType::kF32;
  ps.hidden_dtype = DType::kF32;
  Problem problem = MakeProblem(ps);
  ASSERT_TRUE(UploadHead(stub(), "h", problem).ok());

  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  auto stream = stub().Compute(&context);
  std::atomic<bool> all_written{false};
  std::thread writer([&] {
    stream->Write(HeaderMessage(MakeHeader(problem, "h", "s", "r1")));
    constexpr int64_t kRows = 16;  // 32 KiB messages, under the 64 KiB limit
    const int64_t row_bytes = ps.hidden_size * 4;
    for (int64_t t = 0; t < ps.num_tokens; t += kRows) {
      if (!stream->Write(
              HiddenMessage(t, problem.hidden_bytes.substr(t * row_bytes, kRows * row_bytes)))) {
        break;
      }
    }
    stream->Write(EndMessage(ps.num_tokens));
    stream->WritesDone();
    all_written.store(true);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  EXPECT_FALSE(all_written.load()) << "the server kept reading while nobody read its output";

  int64_t rows = 0;
  bool summary = false;
  v1::ComputeResponse response;
  while (stream->Read(&response)) {
    if (response.has_grad_input()) rows += response.grad_input().num_tokens();
    summary |= response.has_summary();
  }
  writer.join();
  grpc::Status status = stream->Finish();
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_TRUE(summary);
  EXPECT_EQ(rows, ps.num_tokens);
}

void ExpectGradUnchanged(v1::Flce::Stub &stub, const std::string &session_id,
                         const FetchedGrad &before) {
  ASSERT_TRUE(before.status.ok());
  FetchedGrad after = FetchGrad(stub, "h", session_id);
  ASSERT_TRUE(after.status.ok());
  EXPECT_EQ(after.header.contributions(), before.header.contributions());
  EXPECT_EQ(after.weight, before.weight);
}

TEST_F(ComputeTest, WorkspaceTooSmallNamesTheFlagAndChangesNothing) {
  ServerConfig config = TestConfig();
  config.workspace_bytes = 1024;  // not even one token of a V=211 head
  StartServer(config);
  Problem problem = MakeProblem(SmallSpec());
  ASSERT_TRUE(UploadHead(stub(), "h", problem).ok());
  ComputeOutcome out = Compute(stub(), MakeHeader(problem, "h", "s", "w"), problem);
  EXPECT_EQ(out.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(out.status.error_message(), HasSubstr("--workspace-mb"));
  FetchedGrad grad = FetchGrad(stub(), "h", "s");
  if (grad.status.ok()) {
    EXPECT_EQ(grad.header.contributions(), 0);
    for (float g : grad.weight) ASSERT_EQ(g, 0.0f);
  }
}

TEST_F(ComputeTest, MaxRequestTokensIsEnforced) {
  ServerConfig config = TestConfig();
  config.max_request_tokens = 32;
  StartServer(config);
  Problem problem = MakeProblem(SmallSpec());  // 40 tokens
  ASSERT_TRUE(UploadHead(stub(), "h", problem).ok());
  ProblemSpec small_spec = SmallSpec();
  small_spec.num_tokens = 8;
  Problem small = MakeProblem(small_spec);
  ASSERT_TRUE(UploadHead(stub(), "h", small).ok());
  ASSERT_TRUE(Compute(stub(), MakeHeader(small, "h", "s", "seed"), small).status.ok());
  FetchedGrad before = FetchGrad(stub(), "h", "s");
  ComputeOutcome out = Compute(stub(), MakeHeader(problem, "h", "s", "big"), problem);
  EXPECT_EQ(out.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(out.status.error_message(), HasSubstr("--max-request-tokens=32"));
  ExpectGradUnchanged(stub(), "s", before);
}

TEST_F(ComputeTest, MaxSessionsIsEnforced) {
  ServerConfig config = TestConfig();
  config.max_sessions = 2;
  StartServer(config);
  Problem problem = MakeProblem(SmallSpec());
  ASSERT_TRUE(UploadHead(stub(), "h", problem).ok());
  ASSERT_TRUE(Compute(stub(), MakeHeader(problem, "h", "a", "1"), problem).status.ok());
  ASSERT_TRUE(Compute(stub(), MakeHeader(problem, "h", "b", "2"), problem).status.ok());
  FetchedGrad before = FetchGrad(stub(), "h", "a");
  ComputeOutcome third = Compute(stub(), MakeHeader(problem, "h", "c", "3"), problem);
  EXPECT_EQ(third.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(third.status.error_message(), HasSubstr("--max-sessions=2"));
  ExpectGradUnchanged(stub(), "a", before);
  EXPECT_EQ(FetchGrad(stub(), "h", "c").status.error_code(), grpc::StatusCode::NOT_FOUND);
  // Deleting one makes room.
  grpc::ClientContext context;
  v1::DeleteSessionRequest del;
  del.set_head_id("h");
  del.set_session_id("a");
  v1::DeleteSessionResponse deleted;
  ASSERT_TRUE(stub().DeleteSession(&context, del, &deleted).ok());
  EXPECT_TRUE(Compute(stub(), MakeHeader(problem, "h", "c", "3"), problem).status.ok());
}

TEST_F(ComputeTest, MaxPendingIsEnforced) {
  ServerConfig config = TestConfig();
  config.max_pending = 2;
  StartServer(config);
  Problem problem = MakeProblem(SmallSpec());
  ASSERT_TRUE(UploadHead(stub(), "h", problem).ok());
  for (const char* id : {"p1", "p2"}) {
    v1::ComputeHeader header = MakeHeader(problem, "h", "s", id);
    header.set_commit(v1::COMMIT_DEFERRED);
    ASSERT_TRUE(Compute(stub(), header, problem).status.ok());
  }
  v1::ComputeHeader third = MakeHeader(problem, "h", "s", "p3");
  third.set_commit(v1::COMMIT_DEFERRED);
  FetchedGrad before = FetchGrad(stub(), "h", "s");
  ComputeOutcome out = Compute(stub(), third, problem);
  EXPECT_EQ(out.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(out.status.error_message(), HasSubstr("--max-pending=2"));
  ExpectGradUnchanged(stub(), "s", before);
  EXPECT_EQ(SessionNamed(stub(), "s").pending(), 2);
  ASSERT_TRUE(Commit(stub(), "h", "s", "p1", 1.0f, false).ok());
  EXPECT_TRUE(Compute(stub(), third, problem).status.ok());
}

TEST_F(ComputeTest, IdleSessionsExpire) {
  ServerConfig config = TestConfig();
  config.session_ttl = absl::Milliseconds(200);
  config.sweep_interval = absl::Milliseconds(50);
  StartServer(config);
  Problem problem = MakeProblem(SmallSpec());
  ASSERT_TRUE(UploadHead(stub(), "h", problem).ok());
  v1::ComputeHeader header = MakeHeader(problem, "h", "s", "x");
  header.set_commit(v1::COMMIT_DEFERRED);
  ASSERT_TRUE(Compute(stub(), header, problem).status.ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(600));
  EXPECT_EQ(FetchGrad(stub(), "h", "s").status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(Commit(stub(), "h", "s", "x", 1.0f, false).error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(ComputeTest, ServerInfoAndHeads) {
  StartServer(TestConfig());
  Problem problem = MakeProblem(SmallSpec());
  ASSERT_TRUE(UploadHead(stub(), "h", problem).ok());
  {
    grpc::ClientContext context;
    v1::ServerInfo info;
    ASSERT_TRUE(stub().GetServerInfo(&context, v1::ServerInfoRequest(), &info).ok());
    EXPECT_EQ(info.instance_id(), server().instance_id());
    EXPECT_EQ(info.engine(), "cpu");
    EXPECT_EQ(info.max_request_tokens(), TestConfig().max_request_tokens);
  }
  {
    grpc::ClientContext context;
    v1::ListHeadsResponse heads;
    ASSERT_TRUE(stub().ListHeads(&context, v1::ListHeadsRequest(), &heads).ok());
    ASSERT_EQ(heads.heads_size(), 1);
    EXPECT_EQ(heads.heads(0).vocab_size(), problem.spec.vocab_size);
    EXPECT_EQ(heads.heads(0).weight_bytes(),
              problem.spec.vocab_size * problem.spec.hidden_size * 4);
  }
  ASSERT_TRUE(Compute(stub(), MakeHeader(problem, "h", "s", "1"), problem).status.ok());
  {
    grpc::ClientContext context;
    v1::UnloadHeadRequest request;
    request.set_head_id("h");
    v1::UnloadHeadResponse response;
    ASSERT_TRUE(stub().UnloadHead(&context, request, &response).ok());
    EXPECT_EQ(response.sessions_dropped(), 1);
  }
  grpc::ClientContext context;
  v1::DescribeHeadRequest request;
  request.set_head_id("h");
  v1::HeadInfo info;
  grpc::Status gone = stub().DescribeHead(&context, request, &info);
  EXPECT_EQ(gone.error_code(), grpc::StatusCode::NOT_FOUND);
}

}  // namespace
}  // namespace flce::server::test
