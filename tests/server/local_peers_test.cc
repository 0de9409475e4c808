// Who may register regions: --local-transports read into the config, the
// rule LocalPeers applies to a peer, and a server started with the default
// ("auto") offering them to a client on its Unix socket that runs as its
// user, and to nobody else: not over TCP loopback, not to another uid. Also
// the per-tenant cap on registered region bytes.
#include "server/state/local_peers.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <memory>
#include <string>

#include "gmock/gmock.h"
#include "grpcpp/create_channel_posix.h"
#include "gtest/gtest.h"
#include "server/base/local_transports_flag.h"
#include "tests/server/region_helpers.h"
#include "tests/server/server_test_util.h"

namespace flce::server::test {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

TEST(LocalTransportsFlagTest, AutoIsBothKindsForTheSameUid) {
  ServerConfig config;
  ASSERT_TRUE(ApplyLocalTransportsFlag("auto", config).ok());
  EXPECT_TRUE(config.shm_transport);
  EXPECT_TRUE(config.cuda_ipc_transport);
  EXPECT_TRUE(config.local_transports_same_uid);
  EXPECT_TRUE(config.local_transports_auto);
}

TEST(LocalTransportsFlagTest, AListIsForEveryClientOnTheHost) {
  ServerConfig config;
  ASSERT_TRUE(ApplyLocalTransportsFlag("shm", config).ok());
  EXPECT_TRUE(config.shm_transport);
  EXPECT_FALSE(config.cuda_ipc_transport);
  EXPECT_FALSE(config.local_transports_same_uid);
  ASSERT_TRUE(ApplyLocalTransportsFlag("same-uid:cuda_ipc", config).ok());
  EXPECT_FALSE(config.shm_transport);
  EXPECT_TRUE(config.cuda_ipc_transport);
  EXPECT_TRUE(config.local_transports_same_uid);
  EXPECT_FALSE(config.local_transports_auto);
  ASSERT_TRUE(ApplyLocalTransportsFlag("none", config).ok());
  EXPECT_FALSE(config.shm_transport || config.cuda_ipc_transport);
}

TEST(LocalTransportsFlagTest, AnUnknownPartIsNamedAndChangesNothing) {
  ServerConfig config;
  ASSERT_TRUE(ApplyLocalTransportsFlag("auto", config).ok());
  absl::Status bad = ApplyLocalTransportsFlag("shm,rdma", config);
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.message(), HasSubstr("unknown transport \"rdma\""));
  EXPECT_TRUE(config.local_transports_auto);
  EXPECT_THAT(ApplyLocalTransportsFlag("same-uid:", config).message(), HasSubstr("names no"));
}

TEST(LocalPeersTest, TheKernelsUidDecidesUnderTheSameUidRule) {
  LocalPeers peers(LocalTransportRule{true, false, /*same_uid_only=*/true}, /*server_uid=*/1000);
  peers.Record(7, 1000);
  peers.Record(8, 1001);
  EXPECT_TRUE(peers.OfferTo("fd:7").shm);
  EXPECT_FALSE(peers.OfferTo("fd:7").cuda_ipc);
  LocalOffer other = peers.OfferTo("fd:8");
  EXPECT_FALSE(other.any());
  EXPECT_THAT(other.refusal, HasSubstr("uid 1001"));
  LocalOffer loopback = peers.OfferTo("ipv4:127.0.0.1:4000");
  EXPECT_FALSE(loopback.any());
  EXPECT_THAT(loopback.refusal, HasSubstr("over TCP"));
  EXPECT_FALSE(peers.OfferTo("unix:/run/flce.sock").any());  // gRPC's own: uid unknown
  EXPECT_FALSE(peers.OfferTo("fd:9").any());                 // never recorded
  EXPECT_THAT(peers.OfferTo("ipv4:10.0.0.5:4000").refusal, HasSubstr("server's host"));
  peers.Record(8, 1000);  // the descriptor now holds another connection
  EXPECT_TRUE(peers.OfferTo("fd:8").shm);
}

TEST(LocalPeersTest, TheHostRuleOffersEveryLocalPeer) {
  LocalPeers peers(LocalTransportRule{true, true, /*same_uid_only=*/false}, 1000);
  peers.Record(8, 1001);
  EXPECT_TRUE(peers.OfferTo("ipv4:127.0.0.1:4000").cuda_ipc);
  EXPECT_TRUE(peers.OfferTo("ipv6:[::1]:4000").shm);
  EXPECT_TRUE(peers.OfferTo("fd:8").shm);
  EXPECT_FALSE(peers.OfferTo("ipv4:10.0.0.5:4000").any());
  LocalPeers none(LocalTransportRule{}, 1000);
  EXPECT_THAT(none.OfferTo("fd:8").refusal, HasSubstr("takes no regions"));
}

// One byte with room for one descriptor beside it (SCM_RIGHTS). Not copyable:
// the message points into itself.
struct FdMessage {
  FdMessage() {
    message.msg_iov = &io;
    message.msg_iovlen = 1;
    message.msg_control = control;
    message.msg_controllen = sizeof(control);
  }
  FdMessage(const FdMessage&) = delete;
  char byte = 0;
  iovec io{&byte, 1};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr message{};
};

// A connection to `path` made by a child process running as `uid`, handed
// back to this process (SCM_RIGHTS): the kernel recorded the child's
// credentials for it. -1 when it could not be made.
int ConnectAs(const std::string& path, uid_t uid) {
  int pair[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, pair) != 0) return -1;
  const pid_t child = fork();
  if (child == 0) {
    // Only system calls from here on: the parent has threads.
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::memcpy(address.sun_path, path.c_str(), path.size() + 1);
    if (setgid(uid) != 0 || setuid(uid) != 0) _exit(2);
    const int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    if (fd < 0 || connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
      _exit(3);
    }
    FdMessage out;
    cmsghdr* header = CMSG_FIRSTHDR(&out.message);
    header->cmsg_level = SOL_SOCKET;
    header->cmsg_type = SCM_RIGHTS;
    header->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(header), &fd, sizeof(int));
    _exit(sendmsg(pair[1], &out.message, 0) == 1 ? 0 : 4);
  }
  close(pair[1]);
  FdMessage in;
  int fd = -1;
  if (recvmsg(pair[0], &in.message, 0) == 1 && CMSG_FIRSTHDR(&in.message) != nullptr) {
    std::memcpy(&fd, CMSG_DATA(CMSG_FIRSTHDR(&in.message)), sizeof(int));
  }
  close(pair[0]);
  int status = 0;
  waitpid(child, &status, 0);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? fd : -1;
}

class DefaultLocalTransportsTest : public ServerTest {
 protected:
  void Start(int64_t max_region_bytes_per_tenant = 0) {
    dir_ = std::filesystem::temp_directory_path() /
           ("flce-peers-" + std::to_string(getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
    // Another uid must reach the socket for the refusal to be the server's.
    std::filesystem::permissions(dir_, std::filesystem::perms::all);
    ServerConfig config = TestConfig();
    ASSERT_TRUE(ApplyLocalTransportsFlag("auto", config).ok());  // flce-server's default
    config.unix_socket = (dir_ / "s.sock").string();
    config.max_region_bytes_per_tenant = max_region_bytes_per_tenant;
    StartServer(config);
    std::filesystem::permissions(config.unix_socket, std::filesystem::perms::all);
    unix_stub_ = v1::Flce::NewStub(
        grpc::CreateChannel("unix:" + config.unix_socket, grpc::InsecureChannelCredentials()));
  }
  void TearDown() override {
    unix_stub_.reset();
    ServerTest::TearDown();
    std::filesystem::remove_all(dir_);
  }
  v1::ServerInfo Info(v1::Flce::Stub& stub) {
    grpc::ClientContext context;
    v1::ServerInfo info;
    EXPECT_TRUE(stub.GetServerInfo(&context, v1::ServerInfoRequest(), &info).ok());
    return info;
  }
  std::string socket_path() const { return (dir_ / "s.sock").string(); }

  std::filesystem::path dir_;
  std::unique_ptr<v1::Flce::Stub> unix_stub_;
};

TEST_F(DefaultLocalTransportsTest, TheSameUidOnTheUnixSocketGetsSharedMemory) {
  Start();
  EXPECT_THAT(Info(*unix_stub_).local_transports(), ElementsAre("shm"));  // no GPU: no cuda_ipc
  ShmObject object(1 << 20);
  RegionStream regions(*unix_stub_);
  grpc::Status status;
  EXPECT_FALSE(regions.Register(object, 1 << 20, &status).empty()) << status.error_message();
}

TEST_F(DefaultLocalTransportsTest, TcpLoopbackGetsMessagesOnly) {
  Start();
  EXPECT_THAT(Info(stub()).local_transports(), IsEmpty());
  EXPECT_FALSE(Info(stub()).unix_socket().empty());  // where to go instead
  ShmObject object(1 << 20);
  RegionStream regions(stub());
  grpc::Status status;
  EXPECT_TRUE(regions.Register(object, 1 << 20, &status).empty());
  EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(status.error_message(), HasSubstr("over TCP"));
}

TEST_F(DefaultLocalTransportsTest, AnotherUidOnTheUnixSocketGetsMessagesOnly) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to connect as another uid";
  Start();
  constexpr uid_t kNobody = 65534;
  const int fd = ConnectAs(socket_path(), kNobody);
  ASSERT_GE(fd, 0) << "a child running as uid 65534 could not connect to " << socket_path();
  auto stub = v1::Flce::NewStub(grpc::CreateInsecureChannelFromFd("unix:" + socket_path(), fd));
  EXPECT_THAT(Info(*stub).local_transports(), IsEmpty());
  RegionStream regions(*stub);
  grpc::Status status;
  EXPECT_TRUE(regions.Register("flce-00000000000000000000000000000000", 1 << 20,
                               std::string(16, 'k'), &status)
                  .empty());
  EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(status.error_message(), HasSubstr("uid 65534"));
}

TEST_F(DefaultLocalTransportsTest, ATenantsRegionBytesAreCapped) {
  Start(/*max_region_bytes_per_tenant=*/3 << 20);
  ShmObject a(2 << 20), b(2 << 20), c(1 << 20);
  RegionStream first(*unix_stub_);
  RegionStream second(*unix_stub_);  // the cap is the tenant's, over its streams
  grpc::Status status;
  const std::string id = first.Register(a, 2 << 20, &status);
  ASSERT_FALSE(id.empty()) << status.error_message();
  EXPECT_FALSE(second.Register(c, 1 << 20, &status).empty()) << status.error_message();
  RegionStream third(*unix_stub_);
  EXPECT_TRUE(third.Register(b, 2 << 20, &status).empty());
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(status.error_message(), HasSubstr("3145728 bytes per tenant (--max-region-mb)"));
  ASSERT_TRUE(first.Release(id));
  RegionStream fourth(*unix_stub_);
  EXPECT_FALSE(fourth.Register(b, 2 << 20, &status).empty()) << status.error_message();
}

}  // namespace
}  // namespace flce::server::test
