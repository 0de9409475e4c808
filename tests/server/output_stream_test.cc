// ComputeHeader.output_token: grad_input on a second call (ComputeOutput)
// while hidden goes up on the first. The same results as on one call, either
// call may come first, and a broken or missing half fails the Compute call
// with nothing landed.
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <set>
#include <string>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/server/server_test_util.h"

namespace flce::server::test {
namespace {

using ::flce::test::MakeProblem;
using ::testing::HasSubstr;

std::string Token(char fill) { return std::string(16, fill); }

// A ComputeOutput call read on a thread of its own into fp32 grad_input rows.
class OutputCall {
 public:
  OutputCall(v1::Flce::Stub& stub, const std::string& token, int64_t num_tokens,
             int64_t hidden_size, const std::string& server_instance_id = "")
      : grad_(num_tokens * hidden_size, std::numeric_limits<float>::quiet_NaN()) {
    context_.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    v1::ComputeOutputRequest request;
    request.set_output_token(token);
    request.set_server_instance_id(server_instance_id);
    reader_ = stub.ComputeOutput(&context_, request);
    thread_ = std::thread([this, num_tokens, hidden_size] {
      v1::ComputeResponse response;
      while (reader_->Read(&response)) {
        ++messages_;
        if (!response.has_grad_input()) {
          ++other_messages_;
          continue;
        }
        const v1::GradInputChunk& g = response.grad_input();
        if (g.token_offset() >= 0 && g.token_offset() + g.num_tokens() <= num_tokens &&
            static_cast<int64_t>(g.data().size()) == g.num_tokens() * hidden_size * 4) {
          std::memcpy(grad_.data() + g.token_offset() * hidden_size, g.data().data(),
                      g.data().size());
        }
      }
    });
  }
  ~OutputCall() { Finish(); }

  grpc::Status Finish() {
    if (thread_.joinable()) {
      thread_.join();
      status_ = reader_->Finish();
    }
    return status_;
  }
  void Cancel() { context_.TryCancel(); }
  const std::vector<float>& grad() const { return grad_; }
  int messages() const { return messages_; }
  int other_messages() const { return other_messages_; }

 private:
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReader<v1::ComputeResponse>> reader_;
  std::vector<float> grad_;
  int messages_ = 0;
  int other_messages_ = 0;
  std::thread thread_;
  grpc::Status status_;
};

class OutputStreamTest : public ServerTest {
 protected:
  void Start(absl::Duration attach_timeout = absl::Seconds(30)) {
    ServerConfig config = TestConfig();
    config.output_attach_timeout = attach_timeout;
    config.sweep_interval = absl::Milliseconds(100);
    StartServer(config);
    ProblemSpec spec = TinyF32Spec();
    spec.num_tokens = 61;
    problem_ = MakeProblem(spec);
    ASSERT_TRUE(UploadHead(stub(), "h", problem_).ok());
  }

  v1::ComputeHeader Header(const std::string& session, const std::string& request,
                           const std::string& token) const {
    v1::ComputeHeader header = MakeHeader(problem_, "h", session, request);
    header.set_deterministic(true);
    header.set_output_token(token);
    return header;
  }

  int64_t n() const { return problem_.spec.num_tokens; }
  int64_t h() const { return problem_.spec.hidden_size; }

  Problem problem_;
};

TEST_F(OutputStreamTest, GradInputAndGradWAreThoseOfOneCall) {
  Start();
  ComputeOutcome plain = Compute(stub(), Header("plain", "r1", ""), problem_);
  ASSERT_TRUE(plain.status.ok()) << plain.status.error_message();

  OutputCall output(stub(), Token('a'), n(), h());
  ComputeOutcome split = Compute(stub(), Header("split", "r1", Token('a')), problem_);
  ASSERT_TRUE(split.status.ok()) << split.status.error_message();
  ASSERT_TRUE(output.Finish().ok()) << output.Finish().error_message();

  EXPECT_EQ(split.grad_messages, 0) << "grad_input came on the Compute call too";
  EXPECT_GT(output.messages(), 0);
  EXPECT_EQ(output.other_messages(), 0);
  // Bit for bit: the same engine work, only the way back differs (NaN where a
  // row never arrived would fail this too).
  ASSERT_EQ(output.grad().size(), plain.grad_input.size());
  EXPECT_EQ(0, std::memcmp(output.grad().data(), plain.grad_input.data(),
                           plain.grad_input.size() * sizeof(float)));
  EXPECT_EQ(split.summary.loss(), plain.summary.loss());
  FetchedGrad a = FetchGrad(stub(), "h", "plain");
  FetchedGrad b = FetchGrad(stub(), "h", "split");
  ASSERT_TRUE(a.status.ok() && b.status.ok());
  EXPECT_EQ(a.weight, b.weight);
  EXPECT_EQ(b.header.contributions(), 1);
}

TEST_F(OutputStreamTest, TheOutputCallMayComeAfterTheComputeCall) {
  Start();
  std::unique_ptr<OutputCall> output;
  ComputeOptions options;
  options.pause_after_chunks = 3;
  options.on_pause = [&] {
    // The server already computes (and queues grad_input) before it comes.
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    output = std::make_unique<OutputCall>(stub(), Token('b'), n(), h());
  };
  ComputeOutcome out = Compute(stub(), Header("s", "r1", Token('b')), problem_, options);
  ASSERT_TRUE(out.status.ok()) << out.status.error_message();
  ASSERT_NE(output, nullptr);
  EXPECT_TRUE(output->Finish().ok());
  for (float v : output->grad()) ASSERT_FALSE(std::isnan(v));
}

TEST_F(OutputStreamTest, ACancelledOutputCallFailsTheComputeCallAndLandsNothing) {
  Start();
  OutputCall output(stub(), Token('c'), n(), h());
  ComputeOptions options;
  options.rows_per_chunk = 3;
  options.pause_after_chunks = 2;
  options.on_pause = [&] {
    // Written is not yet read: let the server take the header (and the token)
    // first, else the output call is cancelled before the two calls met.
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    output.Cancel();
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  };
  ComputeOutcome out = Compute(stub(), Header("s", "r1", Token('c')), problem_, options);
  EXPECT_EQ(out.status.error_code(), grpc::StatusCode::CANCELLED) << out.status.error_message();
  EXPECT_THAT(out.status.error_message(), HasSubstr("ComputeOutput"));
  EXPECT_FALSE(out.has_summary);
  FetchedGrad grad = FetchGrad(stub(), "h", "s");
  // The session exists (the call opened it) but holds no contribution.
  if (grad.status.ok()) {
    EXPECT_EQ(grad.header.contributions(), 0);
    for (float v : grad.weight) ASSERT_EQ(v, 0.0f);
  } else {
    EXPECT_EQ(grad.status.error_code(), grpc::StatusCode::NOT_FOUND);
  }
}

TEST_F(OutputStreamTest, AFailedComputeCallEndsItsOutputCallAborted) {
  Start();
  OutputCall output(stub(), Token('d'), n(), h());
  Problem bad = problem_;
  bad.hidden[5 * h() + 2] = std::numeric_limits<float>::quiet_NaN();
  bad.hidden_bytes.assign(reinterpret_cast<const char*>(bad.hidden.data()),
                          bad.hidden.size() * 4);
  ComputeOutcome out = Compute(stub(), Header("s", "r1", Token('d')), bad);
  EXPECT_EQ(out.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  grpc::Status ended = output.Finish();
  EXPECT_EQ(ended.error_code(), grpc::StatusCode::ABORTED);
  EXPECT_THAT(ended.error_message(), HasSubstr("INVALID_ARGUMENT"));
  EXPECT_THAT(ended.error_message(), HasSubstr("NaN"));
}

TEST_F(OutputStreamTest, AComputeCallWhoseOutputCallNeverComesFailsAndLandsNothing) {
  Start(absl::Milliseconds(500));
  ComputeOutcome out = Compute(stub(), Header("s", "r1", Token('e')), problem_);
  EXPECT_EQ(out.status.error_code(), grpc::StatusCode::FAILED_PRECONDITION)
      << out.status.error_message();
  EXPECT_THAT(out.status.error_message(), HasSubstr("no ComputeOutput call"));
  FetchedGrad grad = FetchGrad(stub(), "h", "s");
  if (grad.status.ok()) EXPECT_EQ(grad.header.contributions(), 0);
}

TEST_F(OutputStreamTest, AnOutputCallWhoseComputeCallNeverComesEndsNotFound) {
  Start(absl::Milliseconds(300));
  OutputCall output(stub(), Token('f'), n(), h());
  grpc::Status ended = output.Finish();
  EXPECT_EQ(ended.error_code(), grpc::StatusCode::NOT_FOUND) << ended.error_message();
  EXPECT_THAT(ended.error_message(), HasSubstr("no Compute call named this output_token"));
  // Its token is free again.
  OutputCall again(stub(), Token('f'), n(), h());
  ComputeOutcome out = Compute(stub(), Header("s", "r1", Token('f')), problem_);
  EXPECT_TRUE(out.status.ok()) << out.status.error_message();
  EXPECT_TRUE(again.Finish().ok());
}

TEST_F(OutputStreamTest, BadTokensAndUsesAreRefusedPrecisely) {
  Start();
  // Too short, on either call.
  ComputeOutcome short_token = Compute(stub(), Header("s", "r1", "short"), problem_);
  EXPECT_EQ(short_token.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(short_token.status.error_message(), HasSubstr("output_token has 5 bytes"));
  OutputCall short_output(stub(), "short", n(), h());
  EXPECT_EQ(short_output.Finish().error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  OutputCall long_output(stub(), std::string(65, 'x'), n(), h());
  EXPECT_EQ(long_output.Finish().error_code(), grpc::StatusCode::INVALID_ARGUMENT);

  // No grad_input to send.
  v1::ComputeHeader forward = Header("s", "r2", Token('g'));
  forward.mutable_outputs()->set_forward_only(true);
  ComputeOutcome forward_only = Compute(stub(), forward, problem_);
  EXPECT_EQ(forward_only.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(forward_only.status.error_message(), HasSubstr("returns none"));

  // Two output calls with one token: the second is refused.
  OutputCall first(stub(), Token('h'), n(), h());
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  OutputCall second(stub(), Token('h'), n(), h());
  EXPECT_EQ(second.Finish().error_code(), grpc::StatusCode::ALREADY_EXISTS);
  ComputeOutcome served = Compute(stub(), Header("s", "r3", Token('h')), problem_);
  EXPECT_TRUE(served.status.ok()) << served.status.error_message();
  EXPECT_TRUE(first.Finish().ok());
}

TEST_F(OutputStreamTest, AnOutputCallForAnotherServerInstanceIsRefused) {
  Start();
  v1::ServerInfo info;
  {
    grpc::ClientContext context;
    ASSERT_TRUE(stub().GetServerInfo(&context, v1::ServerInfoRequest(), &info).ok());
  }
  OutputCall elsewhere(stub(), Token('j'), n(), h(), "not-" + info.instance_id());
  grpc::Status refused = elsewhere.Finish();
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(refused.error_message(), HasSubstr("another server"));
  OutputCall here(stub(), Token('j'), n(), h(), info.instance_id());
  ComputeOutcome out = Compute(stub(), Header("s", "r1", Token('j')), problem_);
  EXPECT_TRUE(out.status.ok()) << out.status.error_message();
  EXPECT_TRUE(here.Finish().ok());
}

TEST_F(OutputStreamTest, TwoComputeCallsCannotShareAToken) {
  Start(absl::Seconds(2));
  ComputeOptions hold;
  hold.pause_after_chunks = 1;
  ComputeOutcome second;
  hold.on_pause = [&] {
    // The first call holds the token (no output call yet): the second is refused.
    second = Compute(stub(), Header("s2", "r2", Token('i')), problem_);
  };
  OutputCall output(stub(), Token('x'), n(), h());  // another token: unrelated
  ComputeOutcome first = Compute(stub(), Header("s1", "r1", Token('i')), problem_, hold);
  // Whichever the server took first holds the token (and, with no output call,
  // fails when the wait runs out); the other is refused.
  const std::set<grpc::StatusCode> codes = {first.status.error_code(),
                                            second.status.error_code()};
  EXPECT_EQ(codes, (std::set<grpc::StatusCode>{grpc::StatusCode::ALREADY_EXISTS,
                                               grpc::StatusCode::FAILED_PRECONDITION}))
      << first.status.error_message() << " / " << second.status.error_message();
  output.Cancel();
}

}  // namespace
}  // namespace flce::server::test
