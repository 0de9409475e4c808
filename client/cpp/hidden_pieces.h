// The ComputePiece streams of one Compute call (servers 0.13+, capability
// "hidden_pieces"): one HTTP/2 connection is served by one thread at each
// end, so a call's hidden goes over several. The client cuts its chunks to
// 1 / streams of a one-stream chunk (a chunk's worth in flight on all the
// streams together); row chunk i goes to stream
// i % streams; stream 0 is the call's own, stream s > 0 a ComputePiece call on
// stub s - 1 (a connection of its own), started once the server has answered
// the header with the call's token. Each stream sends in token order.
#ifndef FLCE_CLIENT_CPP_HIDDEN_PIECES_H_
#define FLCE_CLIENT_CPP_HIDDEN_PIECES_H_

#include <grpcpp/client_context.h>

#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "flce/v1/flce.grpc.pb.h"

namespace flce {

class HiddenPieces {
 public:
  // hidden: tokens x row_bytes, cut into chunks of rows_per_chunk rows.
  // prepare: sets a piece's metadata and deadline.
  HiddenPieces(std::vector<v1::Flce::Stub*> stubs,
               std::function<void(grpc::ClientContext&)> prepare, absl::string_view hidden,
               int64_t row_bytes, int64_t rows_per_chunk);
  ~HiddenPieces() { Join(); }

  int streams() const { return static_cast<int>(stubs_.size()) + 1; }
  // Whether row chunk `chunk` (its first row / rows_per_chunk) is the call's own.
  bool OwnChunk(int64_t chunk) const { return chunk % streams() == 0; }
  // Starts every piece with the call's token (once). A piece that fails while
  // the call runs calls `cancel_call` (once): the server fails the call with
  // a piece that broke after joining, but one that never reached it would
  // keep the call waiting for it.
  void Start(const std::string& token, std::function<void()> cancel_call);
  // The call has ended: nothing is cancelled from now on.
  void CallEnded();
  // The piece failure that cancelled the call, OK if none did.
  absl::Status failure() const;
  // Waits for every piece to be answered (the server answers each once the
  // call has taken its rows, or has ended).
  void Join();

 private:
  void Send(int stream, const std::string& token);

  const std::vector<v1::Flce::Stub*> stubs_;
  const std::function<void(grpc::ClientContext&)> prepare_;
  const absl::string_view hidden_;
  const int64_t row_bytes_;
  const int64_t rows_per_chunk_;
  std::vector<std::thread> threads_;
  mutable std::mutex mu_;
  std::function<void()> cancel_call_;  // guarded by mu_; empty once the call ended
  absl::Status failure_;               // guarded by mu_
};

}  // namespace flce

#endif  // FLCE_CLIENT_CPP_HIDDEN_PIECES_H_
