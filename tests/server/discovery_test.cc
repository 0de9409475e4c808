// What generic tools see of the server: grpc.health.v1 and server reflection,
// spoken with raw bytes through the generic stub (no generated stubs needed).
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

}  // namespace
}  // namespace flce::server::test
