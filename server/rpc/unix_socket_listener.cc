#include "server/rpc/unix_socket_listener.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "grpcpp/server_posix.h"
#include "server/observe/log.h"

namespace flce::server {

absl::StatusOr<std::unique_ptr<UnixSocketListener>> UnixSocketListener::Listen(
    const std::string& path, LocalPeers* peers) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (path.size() >= sizeof(address.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("unix socket path \"", path, "\" is ",
                                                   path.size(), " bytes; at most ",
                                                   sizeof(address.sun_path) - 1, " fit"));
  }
  std::memcpy(address.sun_path, path.data(), path.size());
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat("unix socket: ", std::strerror(errno)));
  }
  // A stale socket file from a server that died would make the bind fail.
  unlink(path.c_str());
  if (bind(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address)) != 0 ||
      listen(fd, SOMAXCONN) != 0) {
    const int err = errno;
    close(fd);
    return absl::UnavailableError(
        absl::StrCat("cannot listen on unix:", path, ": ", std::strerror(err)));
  }
  const int wake = eventfd(0, EFD_CLOEXEC);
  if (wake < 0) {
    const int err = errno;
    close(fd);
    return absl::UnavailableError(absl::StrCat("eventfd: ", std::strerror(err)));
  }
  return std::unique_ptr<UnixSocketListener>(new UnixSocketListener(fd, wake, peers));
}

void UnixSocketListener::Start(grpc::Server* server) {
  thread_ = std::thread([this, server] { AcceptLoop(server); });
}

void UnixSocketListener::AcceptLoop(grpc::Server* server) {
  while (!stopped_.load()) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      LogError(absl::StrCat("unix socket: poll failed (", std::strerror(errno),
                            "); no more connections accepted there"));
      return;
    }
    if (fds[1].revents != 0 || stopped_.load()) return;
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      // EMFILE and the like: the connection waits in the backlog; do not spin.
      if (errno != EINTR && errno != EAGAIN && errno != ECONNABORTED) {
        LogWarning(absl::StrCat("unix socket: accept failed: ", std::strerror(errno)));
        poll(fds + 1, 1, 100);
      }
      continue;
    }
    ucred credentials{};
    socklen_t length = sizeof(credentials);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &credentials, &length) != 0 ||
        length != sizeof(credentials)) {
      LogWarning(absl::StrCat("unix socket: the peer's credentials are unknown (",
                              std::strerror(errno), "); connection closed"));
      close(fd);
      continue;
    }
    peers_->Record(fd, credentials.uid);
    grpc::AddInsecureChannelFromFd(server, fd);  // gRPC owns (and closes) fd now
  }
}

void UnixSocketListener::Stop() {
  if (stopped_.exchange(true)) return;
  const uint64_t one = 1;
  if (write(wake_fd_, &one, sizeof(one)) != sizeof(one)) {
    LogWarning(absl::StrCat("unix socket: cannot wake the accept loop: ", std::strerror(errno)));
  }
  if (thread_.joinable()) thread_.join();
}

UnixSocketListener::~UnixSocketListener() {
  Stop();
  close(listen_fd_);
  close(wake_fd_);
}

}  // namespace flce::server
