// The default Unix socket's directory must be private to the server's user:
// anything else is refused with the reason, and the file is removed at
// shutdown only while it is still this server's.
#include "server/rpc/unix_socket_path.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace flce::server::test {
namespace {

using ::testing::HasSubstr;

class UnixSocketPathTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = std::filesystem::path(::testing::TempDir()) /
            ("flce-socket-path-" + std::to_string(getpid()) + "-" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(root_);
    std::filesystem::create_directories(root_);
  }
  void TearDown() override { std::filesystem::remove_all(root_); }
  std::filesystem::path root_;
};

TEST_F(UnixSocketPathTest, CreatesAPrivateDirectoryAndNamesThePidsSocket) {
  const std::string dir = (root_ / "flce").string();
  absl::StatusOr<std::string> path = UnixSocketPathIn(dir, 4242);
  ASSERT_TRUE(path.ok()) << path.status();
  EXPECT_EQ(*path, dir + "/flce-4242.sock");
  struct stat st;
  ASSERT_EQ(stat(dir.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  EXPECT_FALSE(std::filesystem::exists(*path)) << "the trial bind leaves no file behind";
}

TEST_F(UnixSocketPathTest, RefusesADirectoryOthersMayWriteTo) {
  const std::string dir = (root_ / "shared").string();
  ASSERT_EQ(mkdir(dir.c_str(), 0700), 0);
  ASSERT_EQ(chmod(dir.c_str(), 0777), 0);
  absl::StatusOr<std::string> path = UnixSocketPathIn(dir, 1);
  ASSERT_FALSE(path.ok());
  EXPECT_EQ(path.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(path.status().message(), HasSubstr("not private to this user"));
  EXPECT_THAT(path.status().message(), HasSubstr("mode 0777"));
}

TEST_F(UnixSocketPathTest, RefusesALinkInPlaceOfTheDirectory) {
  const std::filesystem::path real = root_ / "real";
  ASSERT_EQ(mkdir(real.c_str(), 0700), 0);
  const std::filesystem::path link = root_ / "link";
  std::filesystem::create_directory_symlink(real, link);
  absl::StatusOr<std::string> path = UnixSocketPathIn(link.string(), 1);
  ASSERT_FALSE(path.ok());
  EXPECT_THAT(path.status().message(), HasSubstr("is not a directory"));
}

TEST_F(UnixSocketPathTest, RefusesAPathTooLongForASocket) {
  const std::string dir = (root_ / std::string(110, 'd')).string();
  absl::StatusOr<std::string> path = UnixSocketPathIn(dir, 1);
  ASSERT_FALSE(path.ok());
  EXPECT_THAT(path.status().message(), HasSubstr("longer than a socket path may be"));
}

// A socket file at `path`, listening when `listen_on` (the descriptor is
// returned, -1 when not listening: the file stays, nobody behind it).
int SocketFileAt(const std::string& path, bool listen_on) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  memcpy(address.sun_path, path.c_str(), path.size() + 1);
  const int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  EXPECT_EQ(bind(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address)), 0) << path;
  if (listen_on) {
    EXPECT_EQ(listen(fd, 1), 0);
    return fd;
  }
  close(fd);
  return -1;
}

TEST_F(UnixSocketPathTest, SweepsTheSocketsOfServersThatAreGone) {
  const std::filesystem::path dir = root_ / "flce";
  ASSERT_EQ(mkdir(dir.c_str(), 0700), 0);
  const std::string stale = (dir / "flce-999001.sock").string();
  const std::string live = (dir / "flce-999002.sock").string();
  const std::string other_name = (dir / "trainer.sock").string();
  const std::string not_a_socket = (dir / "flce-999003.sock").string();
  SocketFileAt(stale, false);
  const int listening = SocketFileAt(live, true);
  SocketFileAt(other_name, false);
  std::ofstream(not_a_socket) << "a file";
  absl::StatusOr<std::string> path = UnixSocketPathIn(dir.string(), 4242);
  ASSERT_TRUE(path.ok()) << path.status();
  EXPECT_FALSE(std::filesystem::exists(stale)) << "nobody listens there";
  EXPECT_TRUE(std::filesystem::exists(live)) << "a server listens there";
  EXPECT_TRUE(std::filesystem::exists(other_name)) << "not a name flce-server gives";
  EXPECT_TRUE(std::filesystem::exists(not_a_socket)) << "not a socket";
  close(listening);
}

TEST_F(UnixSocketPathTest, RemovesOnlyTheFileItRemembers) {
  const std::string path = (root_ / "flce.sock").string();
  std::ofstream(path) << "first";
  const SocketFile first = RememberSocketFile(path);
  // Another server took the path over: a new file there. The first file stays
  // linked under another name, so that the new one cannot reuse its inode
  // number (a file system may hand a freed number out again at once).
  std::filesystem::rename(path, root_ / "taken-over");
  std::ofstream(path) << "second";
  RemoveSocketFile(first);
  EXPECT_TRUE(std::filesystem::exists(path));
  RemoveSocketFile(RememberSocketFile(path));
  EXPECT_FALSE(std::filesystem::exists(path));
}

}  // namespace
}  // namespace flce::server::test
