// --data-port: the TCP listener of the data plane. Each accepted connection
// is served by a thread of its own (DataPlaneConnection) for as long as its
// call lasts; Stop() closes them all. Plaintext only: a server with TLS has
// no data plane (flce_server.cc refuses the two together).
#ifndef FLCE_SERVER_RPC_DATA_PLANE_LISTENER_H_
#define FLCE_SERVER_RPC_DATA_PLANE_LISTENER_H_

#include <atomic>
#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/observe/metrics.h"
#include "server/rpc/data_plane_connection.h"
#include "server/state/compute_pieces.h"

namespace flce::server {

class DataPlaneListener {
 public:
  struct Options {
    int64_t max_frame_bytes = int64_t{64} << 20;
    absl::Duration hello_time = absl::Seconds(10);
    int max_connections = 256;  // open at once; beyond, a connection is closed at once
  };
  // Binds and listens on host:port (port 0: a free one; port() says which).
  static absl::StatusOr<std::unique_ptr<DataPlaneListener>> Listen(const std::string& host,
                                                                   int port, ComputePieces* pieces,
                                                                   Metrics* metrics,
                                                                   Options options);
  int port() const { return port_; }
  void Start();
  // Stops accepting and closes every connection (their calls fail).
  void Stop();
  ~DataPlaneListener();

  DataPlaneListener(const DataPlaneListener&) = delete;
  DataPlaneListener& operator=(const DataPlaneListener&) = delete;

 private:
  struct Served {
    std::weak_ptr<DataPlaneConnection> connection;
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  DataPlaneListener(int listen_fd, int wake_fd, int port, ComputePieces* pieces, Metrics* metrics,
                    Options options)
      : listen_fd_(listen_fd),
        wake_fd_(wake_fd),
        port_(port),
        pieces_(pieces),
        metrics_(metrics),
        options_(options) {}
  void AcceptLoop();
  void Serve(int fd);
  // Joins the threads whose connection has ended; how many are still open.
  size_t ReapLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int listen_fd_;
  const int wake_fd_;  // an eventfd: written to stop the accept loop
  const int port_;
  ComputePieces* const pieces_;
  Metrics* const metrics_;
  const Options options_;
  std::thread thread_;
  std::atomic<bool> stopped_{false};
  absl::Mutex mu_;
  std::list<Served> served_ ABSL_GUARDED_BY(mu_);
};

}  // namespace flce::server

#endif  // FLCE_SERVER_RPC_DATA_PLANE_LISTENER_H_
