#include "core/tcp_socket.h"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>

namespace flce {

TcpOpened OpenTcpSocket(const std::string& host, int port, bool passive,
                        const TcpAddressUse& use) {
  TcpOpened out;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  const char* node = passive && host.empty() ? nullptr : host.c_str();
  if (const int rc = getaddrinfo(node, service.c_str(), &hints, &found); rc != 0) {
    out.resolve_error = rc;
    return out;
  }
  for (addrinfo* a = found; a != nullptr && out.fd < 0; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      out.error = errno;
      continue;
    }
    if (const int err = use(fd, a->ai_addr, a->ai_addrlen); err != 0) {
      out.error = err;
      close(fd);
      continue;
    }
    out.fd = fd;
  }
  freeaddrinfo(found);
  return out;
}

int ConnectWithin(int fd, const sockaddr* address, socklen_t length, int timeout_ms) {
  const int flags = fcntl(fd, F_GETFL);
  if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0) return errno;
  int err = connect(fd, address, length) == 0 ? 0 : errno;
  if (err == EINPROGRESS) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) {
        err = ETIMEDOUT;
        break;
      }
      pollfd p{fd, POLLOUT, 0};
      const int ready = poll(&p, 1, static_cast<int>(left.count()));
      if (ready < 0 && errno == EINTR) continue;
      if (ready < 0) {
        err = errno;
        break;
      }
      if (ready == 0) continue;  // the deadline is checked above
      socklen_t size = sizeof(err);
      if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &size) != 0) err = errno;
      break;
    }
  }
  if (fcntl(fd, F_SETFL, flags) != 0 && err == 0) err = errno;
  return err;
}

}  // namespace flce
