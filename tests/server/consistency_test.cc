// One meaning for a field in every RPC: an empty session_id is "default",
// ZeroGrad of a session that does not exist yet is a no-op, and every message
// the server sends fits a stock gRPC client's 4 MiB receive limit.
#include <cstdint>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/server/server_test_util.h"

namespace flce::server::test {
namespace {

using ::flce::test::MakeProblem;
using ::testing::Each;
using ::testing::HasSubstr;

grpc::Status ZeroGrad(v1::Flce::Stub& stub, const std::string& head_id,
                      const std::string& session_id) {
  grpc::ClientContext context;
  v1::ZeroGradRequest request;
  request.set_head_id(head_id);
  request.set_session_id(session_id);
  v1::ZeroGradResponse response;
  return stub.ZeroGrad(&context, request, &response);
}

grpc::Status DeleteSession(v1::Flce::Stub& stub, const std::string& head_id,
                           const std::string& session_id) {
  grpc::ClientContext context;
  v1::DeleteSessionRequest request;
  request.set_head_id(head_id);
  request.set_session_id(session_id);
  v1::DeleteSessionResponse response;
  return stub.DeleteSession(&context, request, &response);
}

std::vector<std::string> SessionIds(v1::Flce::Stub& stub) {
  grpc::ClientContext context;
  v1::ListSessionsResponse response;
  EXPECT_TRUE(stub.ListSessions(&context, v1::ListSessionsRequest(), &response).ok());
  std::vector<std::string> ids;
  for (const v1::SessionInfo& s : response.sessions()) ids.push_back(s.session_id());
  return ids;
}

class ConsistencyTest : public ServerTest {
 protected:
  // A client as a stock gRPC installation makes it: gRPC's default 4 MiB
  // receive limit (the shared test channel lifts it).
  std::unique_ptr<v1::Flce::Stub> StockStub() {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    return v1::Flce::NewStub(grpc::CreateCustomChannel(
        absl::StrCat("127.0.0.1:", server().port()), grpc::InsecureChannelCredentials(), args));
  }
};

TEST_F(ConsistencyTest, EmptySessionIdIsTheDefaultSessionInEveryRpc) {
  StartServer(TestConfig());
  Problem problem = MakeProblem(ProblemSpec{});
  ASSERT_TRUE(UploadHead(stub(), "h", problem).ok());
  v1::ComputeHeader header = MakeHeader(problem, "h", "", "r1");
  header.set_commit(v1::COMMIT_DEFERRED);
  ComputeOutcome out = Compute(stub(), header, problem);
  ASSERT_TRUE(out.status.ok()) << out.status.error_message();

  grpc::Status commit = Commit(stub(), "h", "", "r1", 1.0f, false);
  ASSERT_TRUE(commit.ok()) << commit.error_message();
  FetchedGrad unnamed = FetchGrad(stub(), "h", "");
  ASSERT_TRUE(unnamed.status.ok()) << unnamed.status.error_message();
  EXPECT_EQ(unnamed.header.contributions(), 1);
  FetchedGrad named = FetchGrad(stub(), "h", "default");
  ASSERT_TRUE(named.status.ok());
  EXPECT_EQ(unnamed.weight, named.weight);

  grpc::Status zero = ZeroGrad(stub(), "h", "");
  ASSERT_TRUE(zero.ok()) << zero.error_message();
  FetchedGrad zeroed = FetchGrad(stub(), "h", "default");
  ASSERT_TRUE(zeroed.status.ok());
  EXPECT_EQ(zeroed.header.contributions(), 0);
  EXPECT_THAT(zeroed.weight, Each(0.0f));

  grpc::Status deleted = DeleteSession(stub(), "h", "");
  ASSERT_TRUE(deleted.ok()) << deleted.error_message();
  EXPECT_TRUE(SessionIds(stub()).empty());
}

TEST_F(ConsistencyTest, ZeroGradOfASessionNotYetCreatedSucceedsAndCreatesNothing) {
  StartServer(TestConfig());
  ASSERT_TRUE(UploadHead(stub(), "h", MakeProblem(ProblemSpec{})).ok());
  grpc::Status zero = ZeroGrad(stub(), "h", "fresh");
  EXPECT_TRUE(zero.ok()) << zero.error_message();
  EXPECT_TRUE(SessionIds(stub()).empty()) << "ZeroGrad allocated a gradient";
  EXPECT_EQ(FetchGrad(stub(), "h", "fresh").status.error_code(), grpc::StatusCode::NOT_FOUND);
  // An unknown head is still an error: there is no gradient shape to be zero.
  grpc::Status no_head = ZeroGrad(stub(), "nohead", "fresh");
  EXPECT_EQ(no_head.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(no_head.error_message(), HasSubstr("\"nohead\""));
}

// 4099 x 256 fp32 is 4 198 400 bytes: one message of it is just over 4 MiB.
ProblemSpec WideGradSpec() {
  ProblemSpec ps;
  ps.vocab_size = 4099;
  ps.hidden_size = 256;
  ps.num_tokens = 16;
  return ps;
}

TEST_F(ConsistencyTest, FetchGradFitsAStockClientWhateverChunkRowsAsks) {
  StartServer(TestConfig());
  Problem problem = MakeProblem(WideGradSpec());
  ASSERT_TRUE(UploadHead(stub(), "h", problem).ok());
  ASSERT_TRUE(Compute(stub(), MakeHeader(problem, "h", "s", "r1"), problem).status.ok());
  FetchedGrad reference = FetchGrad(stub(), "h", "s");
  ASSERT_TRUE(reference.status.ok());

  std::unique_ptr<v1::Flce::Stub> stock = StockStub();
  FetchedGrad fetched = FetchGrad(*stock, "h", "s", false, "", v1::DTYPE_FP32, 1 << 20);
  ASSERT_TRUE(fetched.status.ok()) << fetched.status.error_message();
  EXPECT_GE(fetched.chunks, 2);
  EXPECT_EQ(fetched.weight, reference.weight);
}

TEST_F(ConsistencyTest, StockClientRefusesWhatAServerSendsBeyondFourMiB) {
  // The control for the test above: its client really has the 4 MiB limit.
  ServerConfig config = TestConfig();
  config.max_response_bytes = 64 << 20;
  StartServer(config);
  Problem problem = MakeProblem(WideGradSpec());
  ASSERT_TRUE(UploadHead(stub(), "h", problem).ok());
  ASSERT_TRUE(Compute(stub(), MakeHeader(problem, "h", "s", "r1"), problem).status.ok());
  std::unique_ptr<v1::Flce::Stub> stock = StockStub();
  FetchedGrad fetched = FetchGrad(*stock, "h", "s", false, "", v1::DTYPE_FP32, 1 << 20);
  EXPECT_EQ(fetched.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
}

// 8192 x 256 fp32 is 8 MiB of grad_input, which the CPU engine hands over in
// one piece when chunk_tokens covers the call.
ComputeOutcome ComputeWideGradInput(v1::Flce::Stub& upload, v1::Flce::Stub& compute) {
  ProblemSpec ps;
  ps.vocab_size = 64;
  ps.hidden_size = 256;
  ps.num_tokens = 8192;
  Problem problem = MakeProblem(ps);
  EXPECT_TRUE(UploadHead(upload, "h", problem).ok());
  v1::ComputeHeader header = MakeHeader(problem, "h", "s", "r1");
  header.set_chunk_tokens(ps.num_tokens);
  ComputeOptions options;
  options.rows_per_chunk = 2048;
  options.shuffle = false;
  return Compute(compute, header, problem, options);
}

TEST_F(ConsistencyTest, GradInputFitsAStockClientWhenTheEngineHandsOverMore) {
  StartServer(TestConfig());
  std::unique_ptr<v1::Flce::Stub> stock = StockStub();
  ComputeOutcome out = ComputeWideGradInput(stub(), *stock);
  ASSERT_TRUE(out.status.ok()) << out.status.error_message();
  EXPECT_TRUE(out.has_summary);
  EXPECT_EQ(out.grad_rows, 8192);
  EXPECT_GE(out.grad_messages, 2);
}

TEST_F(ConsistencyTest, StockClientRefusesGradInputSentBeyondFourMiB) {
  // The control for the test above: the engine's piece is larger than 4 MiB.
  ServerConfig config = TestConfig();
  config.max_response_bytes = 64 << 20;
  StartServer(config);
  std::unique_ptr<v1::Flce::Stub> stock = StockStub();
  ComputeOutcome out = ComputeWideGradInput(stub(), *stock);
  EXPECT_EQ(out.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
}

TEST_F(ConsistencyTest, TokenOutputsFitAStockClient) {
  StartServer(TestConfig());
  ProblemSpec ps;
  ps.vocab_size = 16;
  ps.hidden_size = 8;
  ps.num_tokens = 340000;  // 13 bytes each: 4.4 MB of token outputs
  Problem problem = MakeProblem(ps);
  ASSERT_TRUE(UploadHead(stub(), "h", problem).ok());
  v1::ComputeHeader header = MakeHeader(problem, "h", "s", "r1");
  v1::OutputSelection* outputs = header.mutable_outputs();
  outputs->set_forward_only(true);
  outputs->set_per_token_loss(true);
  outputs->set_logprob(true);
  outputs->set_entropy(true);
  outputs->set_accuracy(true);
  ComputeOptions options;
  options.rows_per_chunk = 65536;
  options.shuffle = false;
  std::unique_ptr<v1::Flce::Stub> stock = StockStub();
  ComputeOutcome out = Compute(*stock, header, problem, options);
  ASSERT_TRUE(out.status.ok()) << out.status.error_message();
  EXPECT_TRUE(out.has_summary);
  int64_t tokens = 0;
  for (const v1::TokenOutputsChunk& chunk : out.token_outputs) tokens += chunk.num_tokens();
  EXPECT_EQ(tokens, ps.num_tokens);
  EXPECT_GE(out.token_outputs.size(), 2u);
}

}  // namespace
}  // namespace flce::server::test
