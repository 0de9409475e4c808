// OpenTcpSocket (core/tcp_socket.h), the address walk both ends of the data
// plane use: a listening socket on a free port takes a connection; a host
// that does not resolve and a port nobody listens on are told apart.
// ConnectWithin gives up on a port whose SYNs are dropped.
#include "core/tcp_socket.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>

#include "gtest/gtest.h"

namespace flce {
namespace {

int Listen(int fd, const sockaddr* address, socklen_t length) {
  return bind(fd, address, length) == 0 && listen(fd, 4) == 0 ? 0 : errno;
}

int Connect(int fd, const sockaddr* address, socklen_t length) {
  return connect(fd, address, length) == 0 ? 0 : errno;
}

int PortOf(int fd) {
  sockaddr_in bound{};
  socklen_t length = sizeof(bound);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &length) != 0) return -1;
  return ntohs(bound.sin_port);
}

TEST(TcpSocketTest, AListeningSocketTakesAConnection) {
  const TcpOpened server = OpenTcpSocket("127.0.0.1", 0, /*passive=*/true, Listen);
  ASSERT_GE(server.fd, 0) << server.error;
  const int port = PortOf(server.fd);
  ASSERT_GT(port, 0);
  const TcpOpened client = OpenTcpSocket("127.0.0.1", port, /*passive=*/false, Connect);
  ASSERT_GE(client.fd, 0) << client.error;
  const int accepted = accept(server.fd, nullptr, nullptr);
  EXPECT_GE(accepted, 0);
  const char byte = 'x';
  ASSERT_EQ(send(client.fd, &byte, 1, 0), 1);
  char got = 0;
  EXPECT_EQ(recv(accepted, &got, 1, 0), 1);
  EXPECT_EQ(got, 'x');
  close(accepted);
  close(client.fd);
  close(server.fd);
}

TEST(TcpSocketTest, UnresolvedHostsAndRefusedPortsAreToldApart) {
  const TcpOpened unresolved =
      OpenTcpSocket("no-such-host.invalid", 80, /*passive=*/false, Connect);
  EXPECT_EQ(unresolved.fd, -1);
  EXPECT_NE(unresolved.resolve_error, 0);

  // A port that was just free: nobody listens there.
  const TcpOpened probe = OpenTcpSocket("127.0.0.1", 0, /*passive=*/true, Listen);
  ASSERT_GE(probe.fd, 0);
  const int port = PortOf(probe.fd);
  close(probe.fd);
  const TcpOpened refused = OpenTcpSocket("127.0.0.1", port, /*passive=*/false, Connect);
  EXPECT_EQ(refused.fd, -1);
  EXPECT_EQ(refused.resolve_error, 0);
  EXPECT_EQ(refused.error, ECONNREFUSED);
}

// A listener whose accept queue is full: Linux drops the SYNs of further
// connections, as a firewall would, so their connect(2) would retry for minutes.
struct FullListener {
  FullListener() {
    server = OpenTcpSocket("127.0.0.1", 0, /*passive=*/true,
                           [](int fd, const sockaddr* a, socklen_t length) {
                             return bind(fd, a, length) == 0 && listen(fd, 0) == 0 ? 0 : errno;
                           });
    port = PortOf(server.fd);
    queued = OpenTcpSocket("127.0.0.1", port, /*passive=*/false, Connect);  // fills the queue
  }
  ~FullListener() {
    if (queued.fd >= 0) close(queued.fd);
    if (server.fd >= 0) close(server.fd);
  }
  TcpOpened server;
  TcpOpened queued;
  int port = -1;
};

TEST(TcpSocketTest, ConnectWithinGivesUpWhenSynsAreDropped) {
  FullListener full;
  ASSERT_GE(full.server.fd, 0);
  ASSERT_GE(full.queued.fd, 0);
  const auto start = std::chrono::steady_clock::now();
  const TcpOpened late =
      OpenTcpSocket("127.0.0.1", full.port, /*passive=*/false,
                    [](int fd, const sockaddr* a, socklen_t length) {
                      return ConnectWithin(fd, a, length, 300);
                    });
  const auto waited = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(late.fd, -1);
  EXPECT_EQ(late.error, ETIMEDOUT);
  EXPECT_GE(waited, std::chrono::milliseconds(250));
  EXPECT_LT(waited, std::chrono::seconds(5));
}

TEST(TcpSocketTest, ConnectWithinConnectsAndLeavesTheSocketBlocking) {
  const TcpOpened server = OpenTcpSocket("127.0.0.1", 0, /*passive=*/true, Listen);
  ASSERT_GE(server.fd, 0);
  const int port = PortOf(server.fd);
  const TcpOpened client = OpenTcpSocket(
      "127.0.0.1", port, /*passive=*/false,
      [](int fd, const sockaddr* a, socklen_t length) {
        return ConnectWithin(fd, a, length, 2000);
      });
  ASSERT_GE(client.fd, 0) << client.error;
  EXPECT_EQ(fcntl(client.fd, F_GETFL) & O_NONBLOCK, 0);
  close(client.fd);
  close(server.fd);

  const TcpOpened refused = OpenTcpSocket(
      "127.0.0.1", port, /*passive=*/false,
      [](int fd, const sockaddr* a, socklen_t length) {
        return ConnectWithin(fd, a, length, 2000);
      });
  EXPECT_EQ(refused.fd, -1);
  EXPECT_EQ(refused.error, ECONNREFUSED);
}

}  // namespace
}  // namespace flce
