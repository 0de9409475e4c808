#include "core/tcp_socket.h"

#include <netdb.h>
#include <unistd.h>

#include <cerrno>

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

}  // namespace flce
