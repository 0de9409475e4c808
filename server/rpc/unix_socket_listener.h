// The server's Unix-domain socket, accepted here rather than by gRPC: each
// connection's peer credentials (SO_PEERCRED, the uid of the process that
// connected, as the kernel recorded it) go into LocalPeers before the
// connection is handed to gRPC, which serves it like any other (its calls'
// peer is "fd:N"). Plaintext only: gRPC takes descriptors without TLS, so a
// server with TLS lets gRPC listen on the socket instead.
#ifndef FLCE_SERVER_RPC_UNIX_SOCKET_LISTENER_H_
#define FLCE_SERVER_RPC_UNIX_SOCKET_LISTENER_H_

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "grpcpp/server.h"
#include "server/state/local_peers.h"

namespace flce::server {

class UnixSocketListener {
 public:
  // Binds and listens on `path` (a stale socket file there is replaced).
  static absl::StatusOr<std::unique_ptr<UnixSocketListener>> Listen(const std::string& path,
                                                                     LocalPeers* peers);
  // Accepts connections into `server` (started) from a thread of its own.
  void Start(grpc::Server* server);
  // Stops accepting; connections already handed over stay gRPC's.
  void Stop();
  ~UnixSocketListener();

  UnixSocketListener(const UnixSocketListener&) = delete;
  UnixSocketListener& operator=(const UnixSocketListener&) = delete;

 private:
  UnixSocketListener(int listen_fd, int wake_fd, LocalPeers* peers)
      : listen_fd_(listen_fd), wake_fd_(wake_fd), peers_(peers) {}
  void AcceptLoop(grpc::Server* server);

  const int listen_fd_;
  const int wake_fd_;  // an eventfd: written to stop the accept loop
  LocalPeers* const peers_;
  std::thread thread_;
  std::atomic<bool> stopped_{false};
};

}  // namespace flce::server

#endif  // FLCE_SERVER_RPC_UNIX_SOCKET_LISTENER_H_
