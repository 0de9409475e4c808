// What generic tools see of the server: grpc.health.v1 and server reflection,
// spoken with raw bytes through the generic stub (no generated stubs needed);
// and what GetServerInfo tells a client on the server's host about reaching it.
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/cpp/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/server/server_test_util.h"

namespace flce::server::test {
namespace {

using ::testing::HasSubstr;

class DiscoveryTest : public ServerTest {};

TEST_F(DiscoveryTest, HealthServingAndReflectionListsTheService) {
  StartServer(TestConfig());
  std::string health;
  ASSERT_TRUE(RawStream(channel().get(), "/grpc.health.v1.Health/Check", {""}, &health).ok());
  EXPECT_EQ(health, std::string("\x08\x01", 2)) << "SERVING";

  // ServerReflectionRequest{list_services: ""} is field 7, length 0.
  std::string reflection;
  grpc::Status s =
      RawStream(channel().get(), "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
                {std::string("\x3a\x00", 2)}, &reflection);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_THAT(reflection, HasSubstr("flce.v1.Flce"));
  EXPECT_THAT(reflection, HasSubstr("grpc.health.v1.Health"));
}

v1::ServerInfo Info(v1::Flce::Stub& stub) {
  grpc::ClientContext context;
  v1::ServerInfo info;
  grpc::Status status = stub.GetServerInfo(&context, v1::ServerInfoRequest(), &info);
  EXPECT_TRUE(status.ok()) << status.error_message();
  return info;
}

TEST_F(DiscoveryTest, ALocalCallerIsToldTheUnixSocketAsAnAbsolutePathThatReachesThisServer) {
  // Relative, as an operator may give it: the client's working directory is
  // another, so the server must name it absolutely.
  const std::string relative = "flce-discovery-" + std::to_string(getpid()) + ".sock";
  ServerConfig config = TestConfig();
  config.unix_socket = relative;
  StartServer(config);
  const v1::ServerInfo info = Info(stub());  // over loopback TCP: a local caller
  EXPECT_EQ(info.unix_socket(), (std::filesystem::current_path() / relative).string());
  auto unix_channel =
      grpc::CreateChannel("unix:" + info.unix_socket(), grpc::InsecureChannelCredentials());
  auto unix_stub = v1::Flce::NewStub(unix_channel);
  const v1::ServerInfo through_socket = Info(*unix_stub);
  EXPECT_EQ(through_socket.instance_id(), info.instance_id());
  EXPECT_EQ(through_socket.unix_socket(), info.unix_socket());
}

// Sockets bound to `path` in /proc/net/unix: the listener, plus one per
// connection the server accepted on it.
int SocketsAt(const std::string& path) {
  std::ifstream table("/proc/net/unix");
  int count = 0;
  for (std::string line; std::getline(table, line);) {
    if (absl::EndsWith(line, " " + path)) ++count;
  }
  return count;
}

TEST_F(DiscoveryTest, TheCppClientSendsItsBulkCallsThroughTheSocket) {
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("flce-discovery-client-" + std::to_string(getpid()) + ".sock"))
                               .string();
  ServerConfig config = TestConfig();
  config.unix_socket = path;
  StartServer(config);
  const Problem problem = ::flce::test::MakeProblem(TinyF32Spec());
  auto connect = [&](bool unix_socket) {
    ClientOptions options;
    options.target = absl::StrCat("127.0.0.1:", server().port());
    options.transport = ClientOptions::Transport::kGrpc;  // messages
    options.unix_socket = unix_socket;
    auto client = Client::Connect(options);
    EXPECT_TRUE(client.ok()) << client.status();
    return *std::move(client);
  };
  std::unique_ptr<Client> near = connect(true), far = connect(false);
  HeadUpload upload;
  upload.head_id = "h";
  upload.vocab_size = problem.spec.vocab_size;
  upload.hidden_size = problem.spec.hidden_size;
  upload.dtype = v1::DTYPE_FP32;
  upload.weight = problem.weight_bytes;
  const int before = SocketsAt(path);
  ASSERT_TRUE(near->UploadHead(upload).ok());
  EXPECT_EQ(near->messages_target(), "unix:" + path);
  EXPECT_GT(SocketsAt(path), before);
  auto compute = [&](Client& client, const std::string& session) {
    ComputeArgs args;
    args.header = MakeHeader(problem, "h", session, "");
    args.header.clear_targets();
    args.targets = problem.targets;
    args.hidden = problem.hidden_bytes;
    auto outcome = client.Compute(args);
    EXPECT_TRUE(outcome.ok()) << outcome.status();
    return *std::move(outcome);
  };
  const ::flce::ComputeOutcome a = compute(*near, "near"), b = compute(*far, "far");
  EXPECT_EQ(far->messages_target(), absl::StrCat("127.0.0.1:", server().port()));
  EXPECT_EQ(a.summary.loss(), b.summary.loss());
  EXPECT_EQ(a.grad_input, b.grad_input);
}

TEST_F(DiscoveryTest, NoUnixSocketIsToldWithoutOne) {
  StartServer(TestConfig());
  EXPECT_TRUE(Info(stub()).unix_socket().empty());
}

TEST_F(DiscoveryTest, NoneMeansNoUnixSocket) {
  ServerConfig config = TestConfig();
  config.unix_socket = "none";
  StartServer(config);
  EXPECT_TRUE(Info(stub()).unix_socket().empty());
}

// flce-server's default: a socket in a directory private to its user, named
// to local callers, reaching this server, gone after shutdown.
TEST_F(DiscoveryTest, AutoUnixSocketIsPrivateReachableAndRemovedAtShutdown) {
  const std::filesystem::path runtime =
      std::filesystem::path(::testing::TempDir()) / ("flce-runtime-" + std::to_string(getpid()));
  std::filesystem::remove_all(runtime);
  std::filesystem::create_directories(runtime);
  const char* saved = getenv("XDG_RUNTIME_DIR");
  const std::string saved_value = saved != nullptr ? saved : "";
  setenv("XDG_RUNTIME_DIR", runtime.c_str(), 1);
  ServerConfig config = TestConfig();
  config.unix_socket = "auto";
  StartServer(config);
  if (saved != nullptr) {
    setenv("XDG_RUNTIME_DIR", saved_value.c_str(), 1);
  } else {
    unsetenv("XDG_RUNTIME_DIR");
  }
  const v1::ServerInfo info = Info(stub());
  const std::string expected = (runtime / "flce" / ("flce-" + std::to_string(getpid()) + ".sock"));
  EXPECT_EQ(info.unix_socket(), expected);
  struct stat st;
  ASSERT_EQ(stat((runtime / "flce").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  auto unix_stub = v1::Flce::NewStub(
      grpc::CreateChannel("unix:" + info.unix_socket(), grpc::InsecureChannelCredentials()));
  EXPECT_EQ(Info(*unix_stub).instance_id(), info.instance_id());
  server().Shutdown();
  EXPECT_FALSE(std::filesystem::exists(expected));
  std::filesystem::remove_all(runtime);
}

}  // namespace
}  // namespace flce::server::test
