// OpenTcpSocket (core/tcp_socket.h), the address walk both ends of the data
// plane use: a listening socket on a free port takes a connection; a host
// that does not resolve and a port nobody listens on are told apart.
#include "core/tcp_socket.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

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

}  // namespace
}  // namespace flce
