// Hidden rows of one Compute call on several connections (ComputePiece): bit
// for bit the call's own stream; a piece is bound to its call by the token the
// server issued and to the call's tenant; any piece that fails, breaks off or
// is still open at the call's end message fails the whole call, which lands
// nothing.
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "grpc/grpc.h"
#include "gtest/gtest.h"
#include "client/cpp/client.h"
#include "tests/server/server_test_util.h"

namespace flce::server::test {
namespace {

using ::flce::test::MakeProblem;
using ::testing::HasSubstr;

constexpr int64_t kTokens = 60;

// A ComputePiece call on a connection of its own.
class Piece {
 public:
  Piece(const std::string& target, const std::string& bearer = "") {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    stub_ = v1::Flce::NewStub(
        grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args));
    if (!bearer.empty()) context_.AddMetadata("authorization", "Bearer " + bearer);
    context_.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    writer_ = stub_->ComputePiece(&context_, &response_);
  }
  bool Token(const std::string& token) {
    v1::ComputePieceRequest m;
    m.set_token(token);
    return writer_->Write(m);
  }
  bool Rows(const Problem& p, int64_t begin, int64_t end) {
    const int64_t row = p.spec.hidden_size * 4;
    v1::ComputePieceRequest m;
    m.mutable_hidden()->set_token_offset(begin);
    m.mutable_hidden()->set_data(p.hidden_bytes.substr(begin * row, (end - begin) * row));
    return writer_->Write(m);
  }
  bool EndOf(int64_t rows) {
    v1::ComputePieceRequest m;
    m.mutable_end()->set_num_tokens(rows);
    return writer_->Write(m);
  }
  // Half-closes and waits for the server's answer.
  grpc::Status Finish() {
    writer_->WritesDone();
    return writer_->Finish();
  }
  void Cancel() { context_.TryCancel(); }
  int64_t rows() const { return response_.rows(); }

 private:
  std::unique_ptr<v1::Flce::Stub> stub_;
  grpc::ClientContext context_;
  v1::ComputePieceResponse response_;
  std::unique_ptr<grpc::ClientWriter<v1::ComputePieceRequest>> writer_;
};

class ComputePiecesTest : public ServerTest {
 protected:
  void SetUp() override { Start(TestConfig()); }
  void Start(const ServerConfig& config) {
    StartServer(config);
    ProblemSpec spec = TinyF32Spec();
    spec.num_tokens = kTokens;
    problem_ = MakeProblem(spec);
    ASSERT_TRUE(UploadHead(stub(), "h", problem_, 3, nullptr, bearer_).ok());
  }
  std::string target() const { return absl::StrCat("127.0.0.1:", port_); }
  v1::ComputeHeader Header(const std::string& session, const std::string& id, int pieces) {
    v1::ComputeHeader header = MakeHeader(problem_, "h", session, id);
    header.set_deterministic(true);
    header.set_hidden_pieces(pieces);
    return header;
  }
  void ExpectNothingIn(const std::string& session) { ExpectNoContribution(stub(), "h", session); }

  Problem problem_;
  std::string bearer_;
  int port_ = 0;
};

TEST_F(ComputePiecesTest, PiecesCarryRowsBitForBitAsTheCallsOwnStream) {
  port_ = server().port();
  ComputeOptions in_order;
  in_order.shuffle = false;
  ComputeOutcome plain = Compute(stub(), Header("plain", "plain", 0), problem_, in_order);
  ASSERT_TRUE(plain.status.ok()) << plain.status.error_message();

  TokenCall call(stub(), Header("pieced", "pieced", 2));
  ASSERT_EQ(call.token().size(), 16u);
  Piece first(target()), second(target());
  ASSERT_TRUE(first.Token(call.token()) && second.Token(call.token()));
  // Each stream's rows in order, the streams interleaved, on three
  // connections: the engine takes them in token order, as from one stream.
  ASSERT_TRUE(second.Rows(problem_, 10, 20) && second.Rows(problem_, 40, 55));
  ASSERT_TRUE(first.Rows(problem_, 5, 10) && first.Rows(problem_, 30, 40) && first.EndOf(15));
  call.SendRows(problem_, 0, 5);
  call.SendRows(problem_, 20, 30);
  call.SendRows(problem_, 55, 60);
  ASSERT_TRUE(second.EndOf(25));
  grpc::Status a = first.Finish(), b = second.Finish();
  ASSERT_TRUE(a.ok()) << a.error_message();
  ASSERT_TRUE(b.ok()) << b.error_message();
  EXPECT_EQ(first.rows(), 15);
  EXPECT_EQ(second.rows(), 25);
  grpc::Status status = call.End(kTokens, problem_.spec.hidden_size);
  ASSERT_TRUE(status.ok()) << status.error_message();

  EXPECT_EQ(call.summary().loss(), plain.summary.loss());
  EXPECT_EQ(0, std::memcmp(call.grad_input().data(), plain.grad_input.data(),
                           plain.grad_input.size() * sizeof(float)));
  FetchedGrad pieced = FetchGrad(stub(), "h", "pieced");
  FetchedGrad reference = FetchGrad(stub(), "h", "plain");
  ASSERT_TRUE(pieced.status.ok() && reference.status.ok());
  EXPECT_EQ(pieced.weight, reference.weight);
  EXPECT_EQ(pieced.header.contributions(), 1);
}

TEST_F(ComputePiecesTest, APieceThatBreaksOffFailsTheCallAndLandsNothing) {
  port_ = server().port();
  TokenCall call(stub(), Header("s", "broken", 1));
  Piece piece(target());
  ASSERT_TRUE(piece.Token(call.token()));
  ASSERT_TRUE(piece.Rows(problem_, 30, 60));
  grpc::Status piece_status = piece.Finish();  // closed without its end message
  EXPECT_EQ(piece_status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(piece_status.error_message(), HasSubstr("without its end message"));
  call.SendRows(problem_, 0, 30);
  grpc::Status status = call.End(kTokens, problem_.spec.hidden_size);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("without its end message"));
  ExpectNothingIn("s");
}

TEST_F(ComputePiecesTest, ACancelledPieceFailsTheCall) {
  port_ = server().port();
  TokenCall call(stub(), Header("s", "cancelled", 1));
  Piece piece(target());
  ASSERT_TRUE(piece.Token(call.token()));
  ASSERT_TRUE(piece.Rows(problem_, 30, 60));
  piece.Cancel();
  EXPECT_FALSE(piece.Finish().ok());
  call.SendRows(problem_, 0, 30);
  grpc::Status status = call.End(kTokens, problem_.spec.hidden_size);
  EXPECT_FALSE(status.ok());
  ExpectNothingIn("s");
}

// The call's end message waits for the pieces still open; one that then
// breaks off fails the call.
TEST_F(ComputePiecesTest, TheEndMessageWaitsForThePiecesStillOpen) {
  port_ = server().port();
  {
    TokenCall call(stub(), Header("s", "waits", 1));
    Piece piece(target());
    ASSERT_TRUE(piece.Token(call.token()));
    ASSERT_TRUE(piece.Rows(problem_, 30, 60));  // no end message yet
    call.SendRows(problem_, 0, 30);
    std::thread late([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      piece.EndOf(30);
    });
    grpc::Status status = call.End(kTokens, problem_.spec.hidden_size);
    late.join();
    EXPECT_TRUE(status.ok()) << status.error_message();
    EXPECT_TRUE(piece.Finish().ok());
  }
  TokenCall call(stub(), Header("t", "waits-then-fails", 1));
  Piece piece(target());
  ASSERT_TRUE(piece.Token(call.token()));
  ASSERT_TRUE(piece.Rows(problem_, 30, 60));
  call.SendRows(problem_, 0, 30);
  std::thread breaks([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    piece.Cancel();
  });
  grpc::Status status = call.End(kTokens, problem_.spec.hidden_size);
  breaks.join();
  EXPECT_FALSE(status.ok());
  EXPECT_THAT(status.error_message(), HasSubstr("hidden piece 1"));
  ExpectNothingIn("t");
}

TEST_F(ComputePiecesTest, APieceWhoseEndMiscountsItsRowsFailsTheCall) {
  port_ = server().port();
  TokenCall call(stub(), Header("s", "miscount", 1));
  Piece piece(target());
  ASSERT_TRUE(piece.Token(call.token()));
  ASSERT_TRUE(piece.Rows(problem_, 30, 60) && piece.EndOf(29));
  grpc::Status piece_status = piece.Finish();
  EXPECT_EQ(piece_status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(piece_status.error_message(), HasSubstr("says 29 rows; it sent 30"));
  call.SendRows(problem_, 0, 30);
  EXPECT_FALSE(call.End(kTokens, problem_.spec.hidden_size).ok());
  ExpectNothingIn("s");
}

TEST_F(ComputePiecesTest, TokensAndCountsAreChecked) {
  port_ = server().port();
  // An unknown token, and more pieces than the header asked for: those pieces
  // are refused; the call goes on.
  TokenCall call(stub(), Header("s", "counted", 1));
  Piece stranger(target());
  ASSERT_TRUE(stranger.Token(std::string(16, 'x')));
  EXPECT_EQ(stranger.Finish().error_code(), grpc::StatusCode::NOT_FOUND);
  Piece piece(target());
  ASSERT_TRUE(piece.Token(call.token()));
  ASSERT_TRUE(piece.Rows(problem_, 30, 60) && piece.EndOf(30));
  // The call takes rows in token order: the piece is answered once the
  // call's own lower rows have come.
  call.SendRows(problem_, 0, 30);
  ASSERT_TRUE(piece.Finish().ok());
  Piece extra(target());
  extra.Token(call.token());
  EXPECT_EQ(extra.Finish().error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  grpc::Status status = call.End(kTokens, problem_.spec.hidden_size);
  ASSERT_TRUE(status.ok()) << status.error_message();
  // After the call, its token is no more.
  Piece late(target());
  late.Token(call.token());
  EXPECT_EQ(late.Finish().error_code(), grpc::StatusCode::NOT_FOUND);

  TokenCall too_many(stub(), Header("s", "too-many", 9));
  EXPECT_TRUE(too_many.token().empty());
  grpc::Status refused = too_many.End(kTokens, problem_.spec.hidden_size);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(refused.error_message(), HasSubstr("hidden_pieces = 9: must be in [0, 8]"));
}

// The C++ client deals a call's row chunks over its connections.
TEST_F(ComputePiecesTest, TheCppClientSpreadsACallOverItsConnections) {
  port_ = server().port();
  auto connect = [&](int connections) {
    ClientOptions options;
    options.target = target();
    options.transport = ClientOptions::Transport::kGrpc;
    // 9 chunks of 7 rows: 4 streams, over which 60 chunks of one row are dealt
    options.chunk_bytes = 7 * problem_.spec.hidden_size * 4;
    options.connections = connections;
    auto client = Client::Connect(options);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? *std::move(client) : nullptr;
  };
  auto compute = [&](Client& client, const std::string& session) {
    ComputeArgs args;
    args.header = MakeHeader(problem_, "h", session, "");
    args.header.set_deterministic(true);
    args.header.clear_targets();
    args.targets = problem_.targets;
    args.hidden = problem_.hidden_bytes;
    return client.Compute(args);
  };
  std::unique_ptr<Client> one = connect(1), four = connect(4);
  auto a = compute(*one, "one");
  auto b = compute(*four, "four");
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(a->connections, 1);
  EXPECT_EQ(b->connections, 4);
  EXPECT_EQ(a->summary.loss(), b->summary.loss());
  EXPECT_EQ(a->grad_input, b->grad_input);
  EXPECT_EQ(FetchGrad(stub(), "h", "one").weight, FetchGrad(stub(), "h", "four").weight);
  EXPECT_EQ(Sample(server().metrics_text(),
                   "flce_requests_total{code=\"OK\",rpc=\"ComputePiece\"}"),
            3);
  ClientOptions too_many;
  too_many.connections = 10;
  EXPECT_EQ(Client::Connect(too_many).status().code(), absl::StatusCode::kInvalidArgument);
}

// A piece the server refuses before it joins (here: --max-concurrent-streams
// counts the call itself) fails the call at once, with the piece's reason,
// rather than after the server's wait for it.
TEST_F(ComputePiecesTest, ThePiecesRefusalFailsTheCppClientsCallAtOnce) {
  ServerConfig config = TestConfig();
  config.max_concurrent_streams = 1;
  TearDown();
  Start(config);
  port_ = server().port();
  ClientOptions options;
  options.target = target();
  options.transport = ClientOptions::Transport::kGrpc;
  options.chunk_bytes = 7 * problem_.spec.hidden_size * 4;
  options.connections = 2;
  auto client = Client::Connect(options);
  ASSERT_TRUE(client.ok()) << client.status();
  ComputeArgs args;
  args.header = MakeHeader(problem_, "h", "refused", "");
  args.header.clear_targets();
  args.targets = problem_.targets;
  args.hidden = problem_.hidden_bytes;
  const absl::Time started = absl::Now();
  auto out = (*client)->Compute(args);
  EXPECT_LT(absl::Now() - started, absl::Seconds(8));  // not the server's 10 s wait
  ASSERT_EQ(out.status().code(), absl::StatusCode::kResourceExhausted) << out.status();
  EXPECT_THAT(std::string(out.status().message()), HasSubstr("ComputePiece"));
  EXPECT_THAT(std::string(out.status().message()), HasSubstr("--max-concurrent-streams"));
  // The failed call's worker may still count for a moment against the limit of 1.
  FetchedGrad grad = FetchGrad(stub(), "h", "refused");
  for (int i = 0; i < 100 && grad.status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED;
       ++i) {
    absl::SleepFor(absl::Milliseconds(20));
    grad = FetchGrad(stub(), "h", "refused");
  }
  if (grad.status.error_code() != grpc::StatusCode::NOT_FOUND) {
    ASSERT_TRUE(grad.status.ok()) << grad.status.error_message();
    EXPECT_EQ(grad.header.contributions(), 0);
  }
}

class ComputePiecesAuthTest : public ComputePiecesTest {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           absl::StrCat("flce-pieces-auth-", getpid());
    std::filesystem::create_directories(dir_);
    std::ofstream(dir_ / "tokens") << "tok-alice alice\ntok-bob bob\n";
    ServerConfig config = TestConfig();
    config.auth_token_file = (dir_ / "tokens").string();
    bearer_ = "tok-alice";
    Start(config);
  }
  void TearDown() override {
    ComputePiecesTest::TearDown();
    std::filesystem::remove_all(dir_);
  }
  std::filesystem::path dir_;
};

// The token alone does not let another tenant add rows to a call.
TEST_F(ComputePiecesAuthTest, APieceIsBoundToItsCallsTenant) {
  port_ = server().port();
  TokenCall call(stub(), Header("s", "alices", 1), "tok-alice");
  ASSERT_FALSE(call.token().empty());
  Piece bobs(target(), "tok-bob");
  ASSERT_TRUE(bobs.Token(call.token()));
  EXPECT_EQ(bobs.Finish().error_code(), grpc::StatusCode::NOT_FOUND);
  Piece alices(target(), "tok-alice");
  ASSERT_TRUE(alices.Token(call.token()));
  ASSERT_TRUE(alices.Rows(problem_, 30, 60) && alices.EndOf(30));
  call.SendRows(problem_, 0, 30);
  grpc::Status alices_status = alices.Finish();
  ASSERT_TRUE(alices_status.ok()) << alices_status.error_code() << " " << alices_status.error_message();
  grpc::Status status = call.End(kTokens, problem_.spec.hidden_size);
  ASSERT_TRUE(status.ok()) << status.error_message();
}

}  // namespace
}  // namespace flce::server::test
