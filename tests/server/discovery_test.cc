// What generic tools see of the server: grpc.health.v1 and server reflection,
// spoken with raw bytes through the generic stub (no generated stubs needed);
// and what GetServerInfo tells a client on the server's host about reaching it.
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

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

TEST_F(DiscoveryTest, NoUnixSocketIsToldWithoutOne) {
  StartServer(TestConfig());
  EXPECT_TRUE(Info(stub()).unix_socket().empty());
}

}  // namespace
}  // namespace flce::server::test
