// What generic tools see of the server: grpc.health.v1 and server reflection,
// spoken with raw bytes through the generic stub (no generated stubs needed).
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "grpcpp/generic/generic_stub.h"
#include "gtest/gtest.h"
#include "tests/server/server_test_util.h"

namespace flce::server::test {
namespace {

using ::testing::HasSubstr;

std::string Bytes(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  buffer.Dump(&slices);
  std::string out;
  for (const auto& s : slices) out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

grpc::ByteBuffer Buffer(const std::string& bytes) {
  grpc::Slice slice(bytes.data(), bytes.size());
  return grpc::ByteBuffer(&slice, 1);
}

// One request message on a (possibly streaming) method, every response
// message concatenated.
grpc::Status OneShot(grpc::Channel* channel, const std::string& method, const std::string& request,
                     std::string* response) {
  grpc::GenericStub stub(channel->shared_from_this());
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::CompletionQueue cq;
  void* tag;
  bool ok;
  auto call = stub.PrepareCall(&context, method, &cq);
  call->StartCall(reinterpret_cast<void*>(1));
  cq.Next(&tag, &ok);
  grpc::ByteBuffer out = Buffer(request);
  call->Write(out, reinterpret_cast<void*>(2));
  cq.Next(&tag, &ok);
  call->WritesDone(reinterpret_cast<void*>(3));
  cq.Next(&tag, &ok);
  while (true) {
    grpc::ByteBuffer in;
    call->Read(&in, reinterpret_cast<void*>(4));
    cq.Next(&tag, &ok);
    if (!ok) break;
    *response += Bytes(in);
  }
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(5));
  cq.Next(&tag, &ok);
  return status;
}

class DiscoveryTest : public ServerTest {};

TEST_F(DiscoveryTest, HealthServingAndReflectionListsTheService) {
  StartServer(TestConfig());
  std::string health;
  ASSERT_TRUE(OneShot(channel().get(), "/grpc.health.v1.Health/Check", "", &health).ok());
  EXPECT_EQ(health, std::string("\x08\x01", 2)) << "SERVING";

  // ServerReflectionRequest{list_services: ""} is field 7, length 0.
  std::string reflection;
  grpc::Status s =
      OneShot(channel().get(), "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
              std::string("\x3a\x00", 2), &reflection);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_THAT(reflection, HasSubstr("flce.v1.Flce"));
  EXPECT_THAT(reflection, HasSubstr("grpc.health.v1.Health"));
}

}  // namespace
}  // namespace flce::server::test
