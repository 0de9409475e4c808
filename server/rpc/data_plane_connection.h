// One data-plane connection (ComputeHeader.data_plane; docs/API.md, "The data
// plane"): raw rows and grad_input on a TCP connection beside gRPC, without a
// protobuf copy or HTTP/2 framing on either side. Its hello names the call by
// the token that the call's own stream handed its client; it then joins the
// call as its one piece, offers each frame of rows as a hidden chunk, and
// carries the call's grad_input back in frames. Whatever goes wrong on it
// after it joined fails the call, which lands nothing.
#ifndef FLCE_SERVER_RPC_DATA_PLANE_CONNECTION_H_
#define FLCE_SERVER_RPC_DATA_PLANE_CONNECTION_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/observe/metrics.h"
#include "server/state/compute_pieces.h"

namespace flce::server {

class DataPlaneConnection : public BulkWriter,
                            public std::enable_shared_from_this<DataPlaneConnection> {
 public:
  // Owns `fd`, a connected TCP socket. Frames above max_frame_bytes fail the
  // call (--max-message-bytes, as a message would).
  DataPlaneConnection(int fd, ComputePieces* pieces, Metrics* metrics, int64_t max_frame_bytes,
                      absl::Duration hello_time);
  ~DataPlaneConnection() override;
  DataPlaneConnection(const DataPlaneConnection&) = delete;
  DataPlaneConnection& operator=(const DataPlaneConnection&) = delete;

  // Reads the connection until it ends (on a thread of its own). A hello
  // that is late, malformed or names no call closes it without touching any.
  void Serve();

  absl::Status Write(int64_t token_offset, absl::string_view data) override;
  void Close() override;

 private:
  // The rows of one call: frames until the end frame, offered to `target`.
  void Feed(PieceTarget& target, int piece);
  // Exactly `n` bytes, or why not (the peer closed, an error, Close()).
  absl::Status ReadFully(void* out, size_t n);
  // Blocks until the call has room for the next frame or the connection is closed.
  void WaitForRoom();

  const int fd_;
  ComputePieces* const pieces_;
  Metrics* const metrics_;
  const int64_t max_frame_bytes_;
  const absl::Duration hello_time_;
  std::atomic<bool> closed_{false};
  absl::Mutex write_mu_;  // one frame at a time
  absl::Mutex room_mu_;
  bool room_ ABSL_GUARDED_BY(room_mu_) = true;
};

}  // namespace flce::server

#endif  // FLCE_SERVER_RPC_DATA_PLANE_CONNECTION_H_
