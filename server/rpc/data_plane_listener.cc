#include "server/rpc/data_plane_listener.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/tcp_socket.h"
#include "server/observe/log.h"

namespace flce::server {

absl::StatusOr<std::unique_ptr<DataPlaneListener>> DataPlaneListener::Listen(
    const std::string& host, int port, ComputePieces* pieces, Metrics* metrics, Options options) {
  const TcpOpened opened =
      OpenTcpSocket(host, port, /*passive=*/true, [](int fd, const sockaddr* a, socklen_t length) {
        const int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        return bind(fd, a, length) == 0 && listen(fd, SOMAXCONN) == 0 ? 0 : errno;
      });
  if (opened.resolve_error != 0) {
    return absl::InvalidArgumentError(absl::StrCat("--data-port: cannot resolve \"", host,
                                                   "\": ", gai_strerror(opened.resolve_error)));
  }
  const int fd = opened.fd;
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on the data port ", host, ":", port,
                                               ": ", std::strerror(opened.error)));
  }
  sockaddr_storage bound{};
  socklen_t length = sizeof(bound);
  getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &length);
  const int bound_port =
      bound.ss_family == AF_INET6
          ? ntohs(reinterpret_cast<const sockaddr_in6*>(&bound)->sin6_port)
          : ntohs(reinterpret_cast<const sockaddr_in*>(&bound)->sin_port);
  const int wake = eventfd(0, EFD_CLOEXEC);
  if (wake < 0) {
    const int err = errno;
    close(fd);
    return absl::UnavailableError(absl::StrCat("eventfd: ", std::strerror(err)));
  }
  return std::unique_ptr<DataPlaneListener>(
      new DataPlaneListener(fd, wake, bound_port, pieces, metrics, options));
}

void DataPlaneListener::Start() {
  thread_ = std::thread([this] { AcceptLoop(); });
}

void DataPlaneListener::AcceptLoop() {
  while (!stopped_.load()) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      LogError(absl::StrCat("data port: poll failed (", std::strerror(errno),
                            "); no more data-plane connections accepted"));
      return;
    }
    if (fds[1].revents != 0 || stopped_.load()) return;
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno != EINTR && errno != EAGAIN && errno != ECONNABORTED) {
        LogWarning(absl::StrCat("data port: accept failed: ", std::strerror(errno)));
        poll(fds + 1, 1, 100);
      }
      continue;
    }
    Serve(fd);
  }
}

void DataPlaneListener::Serve(int fd) {
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  absl::MutexLock lock(&mu_);
  if (ReapLocked() >= static_cast<size_t>(options_.max_connections)) {
    LogWarning(absl::StrCat("data port: ", options_.max_connections,
                            " connections are open; a new one was closed"));
    close(fd);
    return;
  }
  auto connection = std::make_shared<DataPlaneConnection>(fd, pieces_, metrics_,
                                                          options_.max_frame_bytes,
                                                          options_.hello_time);
  auto done = std::make_shared<std::atomic<bool>>(false);
  served_.push_back(Served{connection, std::thread([connection, done]() mutable {
                             connection->Serve();
                             connection.reset();
                             done->store(true);
                           }),
                           done});
}

size_t DataPlaneListener::ReapLocked() {
  for (auto it = served_.begin(); it != served_.end();) {
    if (it->done->load()) {
      it->thread.join();
      it = served_.erase(it);
    } else {
      ++it;
    }
  }
  return served_.size();
}

void DataPlaneListener::Stop() {
  if (stopped_.exchange(true)) return;
  const uint64_t one = 1;
  if (write(wake_fd_, &one, sizeof(one)) != sizeof(one)) {
    LogWarning(absl::StrCat("data port: cannot wake the accept loop: ", std::strerror(errno)));
  }
  if (thread_.joinable()) thread_.join();
  std::list<Served> served;
  {
    absl::MutexLock lock(&mu_);
    served.swap(served_);
  }
  for (Served& s : served) {
    if (auto connection = s.connection.lock()) connection->Close();
  }
  for (Served& s : served) s.thread.join();
}

DataPlaneListener::~DataPlaneListener() {
  Stop();
  close(listen_fd_);
  close(wake_fd_);
}

}  // namespace flce::server
