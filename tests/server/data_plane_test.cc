// The data plane (--data-port, ComputeHeader.data_plane): rows and grad_input
// as raw bytes on a TCP connection beside the call's stream give the call's
// results bit for bit; the connection is bound to its call by the token the
// server issued; whatever breaks it fails the call, which lands nothing; a
// hello that names no call touches none.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/cpp/client.h"
#include "client/cpp/data_plane_link.h"
#include "core/data_plane_frame.h"
#include "server/base/data_port_flag.h"
#include "server/base/receive_buffers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/server/server_test_util.h"
#include "tests/server/test_certs.h"

namespace flce::server::test {
namespace {

using ::flce::test::MakeProblem;
using ::flce::test::TestCerts;
using ::testing::HasSubstr;

constexpr int64_t kTokens = 60;

// A raw TCP connection to the data port: the test writes the bytes itself.
class RawConnection {
 public:
  explicit RawConnection(int port) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(static_cast<uint16_t>(port));
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = connect(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0;
  }
  ~RawConnection() { close(fd_); }
  bool connected() const { return connected_; }
  bool Send(const std::string& bytes) {
    return send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL) ==
           static_cast<ssize_t>(bytes.size());
  }
  bool Hello(const std::string& token) {
    return Send(std::string(data_plane::kMagic, sizeof(data_plane::kMagic)) + token);
  }
  bool Frame(int64_t token_offset, const std::string& payload, int64_t count = -1) {
    unsigned char header[data_plane::kFrameHeaderBytes];
    data_plane::EncodeFrameHeader(
        {token_offset, count >= 0 ? count : static_cast<int64_t>(payload.size())}, header);
    return Send(std::string(reinterpret_cast<char*>(header), sizeof(header)) + payload);
  }
  // True when the server closed the connection (reads end) within 10 s.
  bool ClosedByServer() {
    timeval tv{10, 0};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    char byte;
    return recv(fd_, &byte, 1, 0) == 0;
  }
  void Close() { shutdown(fd_, SHUT_RDWR); }

 private:
  int fd_ = -1;
  bool connected_ = false;
};

class DataPlaneTest : public ServerTest {
 protected:
  void SetUp() override { Start(WithDataPlane()); }
  static ServerConfig WithDataPlane() {
    ServerConfig config = TestConfig();
    config.data_port = 0;
    return config;
  }
  void Start(const ServerConfig& config) {
    StartServer(config);
    ProblemSpec spec = TinyF32Spec();
    spec.num_tokens = kTokens;
    problem_ = MakeProblem(spec);
    ASSERT_TRUE(UploadHead(stub(), "h", problem_).ok());
  }
  std::unique_ptr<Client> Connect(ClientOptions::DataPlane mode, int64_t rows_per_chunk = 7) {
    ClientOptions options;
    options.target = absl::StrCat("127.0.0.1:", server().port());
    options.transport = ClientOptions::Transport::kGrpc;
    options.chunk_bytes = rows_per_chunk * problem_.spec.hidden_size * 4;
    options.data_plane = mode;
    auto client = Client::Connect(options);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? *std::move(client) : nullptr;
  }
  absl::StatusOr<flce::ComputeOutcome> ComputeWith(Client& client, const std::string& session) {
    ComputeArgs args;
    args.header = MakeHeader(problem_, "h", session, "");
    args.header.set_deterministic(true);
    args.header.mutable_outputs()->set_logprob(true);
    args.header.clear_targets();
    args.targets = problem_.targets;
    args.hidden = problem_.hidden_bytes;
    return client.Compute(args);
  }
  v1::ComputeHeader Header(const std::string& session) {
    v1::ComputeHeader header = MakeHeader(problem_, "h", session, session);
    header.set_deterministic(true);
    header.set_data_plane(true);
    return header;
  }
  std::string Rows(int64_t begin, int64_t end) const {
    const int64_t row = problem_.spec.hidden_size * 4;
    return problem_.hidden_bytes.substr(begin * row, (end - begin) * row);
  }

  Problem problem_;
};

TEST_F(DataPlaneTest, TheCppClientsDataPlaneGivesTheMessagesResultsBitForBit) {
  std::unique_ptr<Client> messages = Connect(ClientOptions::DataPlane::kOff);
  std::unique_ptr<Client> data = Connect(ClientOptions::DataPlane::kAuto);
  auto a = ComputeWith(*messages, "messages");
  auto b = ComputeWith(*data, "data");
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(a->transport, "grpc");
  EXPECT_EQ(b->transport, "data_plane");
  EXPECT_EQ(a->summary.loss(), b->summary.loss());
  EXPECT_EQ(a->grad_input, b->grad_input);
  EXPECT_EQ(a->logprob, b->logprob);
  FetchedGrad ga = FetchGrad(stub(), "h", "messages"), gb = FetchGrad(stub(), "h", "data");
  ASSERT_TRUE(ga.status.ok() && gb.status.ok());
  EXPECT_EQ(ga.weight, gb.weight);
  EXPECT_EQ(gb.header.contributions(), 1);

  const std::string metrics = server().metrics_text();
  const double bytes = static_cast<double>(problem_.hidden_bytes.size());
  EXPECT_EQ(Sample(metrics, "flce_data_plane_bytes_total{direction=\"in\"}"), bytes);
  EXPECT_EQ(Sample(metrics, "flce_data_plane_bytes_total{direction=\"out\"}"), bytes);
  EXPECT_EQ(Sample(metrics, "flce_compute_calls_total{reason=\"asked\",transport=\"data_plane\"}"),
            1);
}

// The data plane's frame buffers go back to the process's pool once the
// engine has the rows, for the next frames; the buffers of messages, which
// gRPC parses into buffers of its own, are not kept.
TEST_F(DataPlaneTest, FrameBuffersAreKeptForTheNextFramesAndMessagesAreNot) {
  ProblemSpec spec = TinyF32Spec();
  spec.hidden_size = 4096;  // 16 KiB rows: 1 MiB frames of 64 rows
  spec.num_tokens = 192;
  Problem wide = MakeProblem(spec);
  ASSERT_TRUE(UploadHead(stub(), "wide", wide).ok());
  ReceiveBuffers& pool = ReceiveBuffers::Shared();
  while (pool.kept_bytes() > 0) pool.Take(1);  // what earlier calls left
  auto compute = [&](ClientOptions::DataPlane mode, const std::string& session) {
    ClientOptions options;
    options.target = absl::StrCat("127.0.0.1:", server().port());
    options.transport = ClientOptions::Transport::kGrpc;
    options.chunk_bytes = 64 * spec.hidden_size * 4;
    options.data_plane = mode;
    auto client = Client::Connect(options);
    ASSERT_TRUE(client.ok()) << client.status();
    ComputeArgs args;
    args.header = MakeHeader(wide, "wide", session, "");
    args.header.clear_targets();
    args.targets = wide.targets;
    args.hidden = wide.hidden_bytes;
    auto out = (*client)->Compute(args);
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_EQ(out->transport, mode == ClientOptions::DataPlane::kOff ? "grpc" : "data_plane");
  };
  compute(ClientOptions::DataPlane::kOff, "messages");
  EXPECT_EQ(pool.kept_bytes(), 0u);
  compute(ClientOptions::DataPlane::kAuto, "frames");
  EXPECT_GE(pool.kept_bytes(), size_t{1} << 20);
  EXPECT_LE(pool.kept_bytes(), size_t{3} << 20);  // at most the call's three frames
}

TEST_F(DataPlaneTest, ServerInfoNamesThePort) {
  std::unique_ptr<Client> client = Connect(ClientOptions::DataPlane::kAuto);
  absl::StatusOr<v1::ServerInfo> info = client->GetServerInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_THAT(info->capabilities(), ::testing::Contains("data_plane"));
  EXPECT_EQ(info->data_plane_port(), server().data_port());
  EXPECT_GT(server().data_port(), 0);
}

TEST_F(DataPlaneTest, RowsInAnyOrderOfFramesAndAForwardOnlyCall) {
  v1::ComputeHeader header = Header("forward");
  header.mutable_outputs()->set_forward_only(true);
  TokenCall call(stub(), header);
  ASSERT_EQ(call.token().size(), 16u);
  RawConnection connection(server().data_port());
  ASSERT_TRUE(connection.connected());
  ASSERT_TRUE(connection.Hello(call.token()));
  ASSERT_TRUE(connection.Frame(30, Rows(30, 60)));
  ASSERT_TRUE(connection.Frame(0, Rows(0, 30)));
  ASSERT_TRUE(connection.Frame(data_plane::kEndOffset, "", kTokens));
  grpc::Status status = call.End(kTokens, problem_.spec.hidden_size);
  EXPECT_TRUE(status.ok()) << status.error_message();
}

TEST_F(DataPlaneTest, AConnectionThatBreaksOffFailsTheCallAndLandsNothing) {
  TokenCall call(stub(), Header("broken"));
  RawConnection connection(server().data_port());
  ASSERT_TRUE(connection.Hello(call.token()));
  ASSERT_TRUE(connection.Frame(0, Rows(0, 30)));
  connection.Close();  // without its end frame
  grpc::Status status = call.End(kTokens, problem_.spec.hidden_size);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("data plane: the connection ended before"));
  ExpectNoContribution(stub(), "h", "broken");
}

TEST_F(DataPlaneTest, FramesAndCountsAreChecked) {
  {
    TokenCall call(stub(), Header("huge"));
    RawConnection connection(server().data_port());
    ASSERT_TRUE(connection.Hello(call.token()));
    ASSERT_TRUE(connection.Frame(0, "", int64_t{1} << 40));  // a frame larger than a message
    grpc::Status status = call.End(kTokens, problem_.spec.hidden_size);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(status.error_message(), HasSubstr("data plane: a frame at token 0"));
    EXPECT_TRUE(connection.ClosedByServer());
  }
  {
    TokenCall call(stub(), Header("miscounted"));
    RawConnection connection(server().data_port());
    ASSERT_TRUE(connection.Hello(call.token()));
    ASSERT_TRUE(connection.Frame(0, Rows(0, 60)));
    ASSERT_TRUE(connection.Frame(data_plane::kEndOffset, "", 59));
    grpc::Status status = call.End(kTokens, problem_.spec.hidden_size);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(status.error_message(), HasSubstr("59 rows"));
  }
  ExpectNoContribution(stub(), "h", "huge");
  ExpectNoContribution(stub(), "h", "miscounted");
}

TEST_F(DataPlaneTest, AHelloThatNamesNoCallIsClosedAndTouchesNone) {
  TokenCall call(stub(), Header("kept"));
  ASSERT_EQ(call.token().size(), 16u);
  std::string wrong = call.token();
  wrong[0] = static_cast<char>(wrong[0] ^ 1);
  RawConnection stranger(server().data_port());
  ASSERT_TRUE(stranger.Hello(wrong));
  EXPECT_TRUE(stranger.ClosedByServer());
  RawConnection garbage(server().data_port());
  ASSERT_TRUE(garbage.Send(std::string(data_plane::kHelloBytes, 'x')));
  EXPECT_TRUE(garbage.ClosedByServer());
  // The call itself is untouched: its own connection joins and it lands.
  RawConnection own(server().data_port());
  ASSERT_TRUE(own.Hello(call.token()));
  ASSERT_TRUE(own.Frame(0, Rows(0, 60)));
  ASSERT_TRUE(own.Frame(data_plane::kEndOffset, "", kTokens));
  // Connections are served by threads of their own, so the second hello could
  // otherwise be read first: the rows counted in show the first one joined.
  const double own_bytes = static_cast<double>(Rows(0, 60).size());
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (Sample(server().metrics_text(), "flce_data_plane_bytes_total{direction=\"in\"}") <
             own_bytes &&
         std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  // A second connection with the right token is refused: one joins a call.
  RawConnection second(server().data_port());
  ASSERT_TRUE(second.Hello(call.token()));
  EXPECT_TRUE(second.ClosedByServer());
  grpc::Status status = call.End(kTokens, problem_.spec.hidden_size);
  EXPECT_TRUE(status.ok()) << status.error_message();
  FetchedGrad grad = FetchGrad(stub(), "h", "kept");
  ASSERT_TRUE(grad.status.ok());
  EXPECT_EQ(grad.header.contributions(), 1);
}

TEST_F(DataPlaneTest, HeadersThatCannotUseItAreRefused) {
  v1::ComputeHeader both = Header("both");
  both.set_hidden_pieces(1);
  TokenCall call(stub(), both);
  EXPECT_TRUE(call.token().empty());
  grpc::Status status = call.End(kTokens, problem_.spec.hidden_size);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("data_plane with hidden_pieces = 1"));
}

TEST_F(DataPlaneTest, AServerWithoutItRefusesTheHeaderAndTheClientFallsBack) {
  TearDown();
  Start(TestConfig());  // no --data-port
  TokenCall call(stub(), Header("refused"));
  grpc::Status status = call.End(kTokens, problem_.spec.hidden_size);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(status.error_message(), HasSubstr("no data plane"));

  auto automatic = ComputeWith(*Connect(ClientOptions::DataPlane::kAuto), "auto");
  ASSERT_TRUE(automatic.ok()) << automatic.status();
  EXPECT_EQ(automatic->transport, "grpc");
  auto required = ComputeWith(*Connect(ClientOptions::DataPlane::kOn), "on");
  EXPECT_EQ(required.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(required.status().message(), HasSubstr("no data plane"));
}

TEST(DataPlaneConfigTest, TlsAndADataPortStopTheStart) {
  const TestCerts& certs = TestCerts::Get();
  ASSERT_TRUE(certs.ok) << certs.error;
  ServerConfig config = TestConfig();
  config.tls_cert = certs.server_cert;
  config.tls_key = certs.server_key;
  config.data_port = 0;
  absl::StatusOr<std::unique_ptr<FlceServer>> server = FlceServer::Create(config);
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(server.status().message(), HasSubstr("--data-port with TLS"));
}

// flce-server's default: a free port, unless the server uses TLS, which
// keeps every byte on gRPC instead of refusing to start.
TEST(DataPlaneConfigTest, AutoOpensAPortWithoutTlsAndNoneWithIt) {
  ServerConfig plain = TestConfig();
  ASSERT_TRUE(ApplyDataPortFlag("auto", plain).ok());
  absl::StatusOr<std::unique_ptr<FlceServer>> open = FlceServer::Create(plain);
  ASSERT_TRUE(open.ok()) << open.status();
  EXPECT_GT((*open)->data_port(), 0);

  const TestCerts& certs = TestCerts::Get();
  ASSERT_TRUE(certs.ok) << certs.error;
  ServerConfig tls = TestConfig();
  tls.tls_cert = certs.server_cert;
  tls.tls_key = certs.server_key;
  ASSERT_TRUE(ApplyDataPortFlag("auto", tls).ok());
  absl::StatusOr<std::unique_ptr<FlceServer>> closed = FlceServer::Create(tls);
  ASSERT_TRUE(closed.ok()) << closed.status();
  EXPECT_EQ((*closed)->data_port(), 0);
}

TEST(DataPortFlagTest, ReadsAutoNoneAndPorts) {
  ServerConfig config;
  EXPECT_EQ(config.data_port, ServerConfig::kDataPortNone);  // embedded servers: none
  for (const auto& [value, port] : std::vector<std::pair<std::string, int>>{
           {"auto", ServerConfig::kDataPortAuto},
           {"none", ServerConfig::kDataPortNone},
           {"-1", ServerConfig::kDataPortNone},
           {"0", 0},
           {"50052", 50052},
           {"65535", 65535}}) {
    SCOPED_TRACE(value);
    ASSERT_TRUE(ApplyDataPortFlag(value, config).ok());
    EXPECT_EQ(config.data_port, port);
  }
  for (const std::string bad : {"", "yes", "65536", "-2", "5005x", "1.5"}) {
    SCOPED_TRACE(bad);
    config.data_port = 7;
    const absl::Status s = ApplyDataPortFlag(bad, config);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(s.message(), HasSubstr(absl::StrCat("got '", bad, "'")));
    EXPECT_EQ(config.data_port, 7);  // unchanged
  }
}

// A data port that never answers (its SYNs dropped: here a listener whose
// accept queue is full) fails the client's connect within its timeout, so
// that a call falls back to messages instead of waiting for the kernel's
// minutes of retries.
TEST(DataPlaneLinkTest, APortThatNeverAnswersFailsWithinTheTimeout) {
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  ASSERT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&address), length), 0);
  ASSERT_EQ(listen(listener, 0), 0);
  ASSERT_EQ(getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length), 0);
  const DataPlaneAddress target{"127.0.0.1", ntohs(address.sin_port)};
  auto queued = DataPlaneLink::Connect(target);  // fills the accept queue
  ASSERT_TRUE(queued.ok()) << queued.status();
  const auto start = std::chrono::steady_clock::now();
  auto late = DataPlaneLink::Connect(target, absl::Milliseconds(300));
  const auto waited = std::chrono::steady_clock::now() - start;
  ASSERT_FALSE(late.ok());
  EXPECT_EQ(late.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(late.status().message(), HasSubstr(absl::StrCat("127.0.0.1:", target.port)));
  EXPECT_LT(waited, std::chrono::seconds(5));
  queued->reset();
  close(listener);
}

TEST(TcpHostOfTest, TargetsThatNameOneTcpAddress) {
  EXPECT_EQ(TcpHostOf("localhost:50051"), "localhost");
  EXPECT_EQ(TcpHostOf("[::1]:50051"), "::1");
  EXPECT_EQ(TcpHostOf("dns:///flce.example:50051"), "flce.example");
  EXPECT_EQ(TcpHostOf("ipv4:10.0.0.2:50051"), "10.0.0.2");
  EXPECT_EQ(TcpHostOf("unix:/run/flce.sock"), std::nullopt);
  EXPECT_EQ(TcpHostOf("ipv4:10.0.0.2:1,10.0.0.3:1"), std::nullopt);
}

}  // namespace
}  // namespace flce::server::test
