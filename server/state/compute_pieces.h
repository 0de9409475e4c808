// The Compute calls that take hidden rows on other connections (ComputePiece):
// each such call is registered under a random token that the server hands
// only to the call's own client (PiecesOpened), and a piece finds its call by
// that token and the piece's tenant, never by a client-chosen name.
//
// A piece joins its call, offers it each parsed message (rows, then its end),
// and is answered once the call has taken every row it sent. Whatever goes
// wrong with a piece once it has joined fails the whole call.
//
// A call that asked for the data plane (ComputeHeader.data_plane) is joined by
// one data-plane connection instead, which presents the token alone (it has
// no tenant of its own: the token was handed only to the call's tenant) and
// also carries the call's grad_input back (BulkWriter).
#ifndef FLCE_SERVER_STATE_COMPUTE_PIECES_H_
#define FLCE_SERVER_STATE_COMPUTE_PIECES_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "flce/v1/flce.pb.h"

namespace flce::server {

// What a piece sees of its call (implemented by the Compute stream).
class PieceTarget {
 public:
  virtual ~PieceTarget() = default;
  // A new piece's number, or why it may not join (the call is over, or has
  // as many pieces as its header asked for). `answer` is called once, with
  // the rows the call took from the piece or the status that ends it.
  virtual absl::StatusOr<int> JoinPiece(std::function<void(absl::StatusOr<int64_t>)> answer) = 0;
  // A piece's next message (a hidden chunk or its end), or the error that
  // fails the call. True: the piece may read its next message now; false: the
  // call calls `resume` once it has room.
  virtual bool OfferPiece(int piece, absl::StatusOr<v1::ComputePieceRequest> message,
                          std::function<void()> resume) = 0;
};

// A data-plane connection as its call writes to it.
class BulkWriter {
 public:
  virtual ~BulkWriter() = default;
  // grad_input rows from token_offset (whole rows) as one frame; blocks until
  // the kernel has taken them all.
  virtual absl::Status Write(int64_t token_offset, absl::string_view data) = 0;
  // Ends the connection: reads and writes on it fail from now on.
  virtual void Close() = 0;
};

class ComputePieces {
 public:
  static constexpr int kMaxPiecesPerCall = 8;

  // A fresh token for `target`, a call of `tenant`; with `data_plane`, only a
  // data-plane connection may join it (AttachDataPlane), else only pieces.
  std::string Register(const std::string& tenant, std::weak_ptr<PieceTarget> target,
                       bool data_plane = false);
  // The call has ended: its token is forgotten and its data-plane connection,
  // if one joined, closed.
  void Remove(const std::string& token);
  // The call behind `token` for `tenant`; NOT_FOUND alike for an unknown
  // token, another tenant's and a call that has ended.
  absl::StatusOr<std::shared_ptr<PieceTarget>> Find(const std::string& token,
                                                    const std::string& tenant) const;
  // The data-plane call behind `token`, which from now on writes to `writer`;
  // NOT_FOUND as Find, ALREADY_EXISTS when a connection has joined it before.
  absl::StatusOr<std::shared_ptr<PieceTarget>> AttachDataPlane(const std::string& token,
                                                               std::shared_ptr<BulkWriter> writer);
  // The connection attached to the call behind `token`, or null.
  std::shared_ptr<BulkWriter> DataPlaneWriter(const std::string& token) const;

 private:
  struct Entry {
    std::string tenant;
    std::weak_ptr<PieceTarget> target;
    bool data_plane = false;
    std::shared_ptr<BulkWriter> writer;
  };
  absl::StatusOr<std::shared_ptr<PieceTarget>> FindLocked(const std::string& token,
                                                          const std::string* tenant,
                                                          bool data_plane) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  mutable absl::Mutex mu_;
  std::map<std::string, Entry> calls_ ABSL_GUARDED_BY(mu_);
};

}  // namespace flce::server

#endif  // FLCE_SERVER_STATE_COMPUTE_PIECES_H_
