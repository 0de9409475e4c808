// A TCP socket on the first of a host's addresses (getaddrinfo) that takes
// it: bound and listening for a server, connected for a client.
#ifndef FLCE_CORE_TCP_SOCKET_H_
#define FLCE_CORE_TCP_SOCKET_H_

#include <sys/socket.h>

#include <functional>
#include <string>

namespace flce {

// What a caller does with a fresh socket for one address: 0, or the errno
// that sends the search to the next address.
using TcpAddressUse = std::function<int(int fd, const sockaddr* address, socklen_t length)>;

struct TcpOpened {
  int fd = -1;               // the socket (close-on-exec), or -1
  int resolve_error = 0;     // getaddrinfo's code (gai_strerror) when the host did not resolve
  int error = 0;             // errno of the last address tried, when none took
};

// `passive`: a server's address (an empty host: every interface).
TcpOpened OpenTcpSocket(const std::string& host, int port, bool passive, const TcpAddressUse& use);

// connect(2) that gives up after timeout_ms: 0, or the errno (ETIMEDOUT when
// the time ran out). A blocking connect to an address whose SYNs are dropped
// (a firewall, a full accept queue) waits for the kernel's SYN retries,
// minutes. fd is left blocking, as it came.
int ConnectWithin(int fd, const sockaddr* address, socklen_t length, int timeout_ms);

}  // namespace flce

#endif  // FLCE_CORE_TCP_SOCKET_H_
