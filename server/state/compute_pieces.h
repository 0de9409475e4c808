// The Compute calls that take hidden rows on other connections (ComputePiece):
// each such call is registered under a random token that the server hands
// only to the call's own client (PiecesOpened), and a piece finds its call by
// that token and the piece's tenant, never by a client-chosen name.
//
// A piece joins its call, offers it each parsed message (rows, then its end),
// and is answered once the call has taken every row it sent. Whatever goes
// wrong with a piece once it has joined fails the whole call.
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

class ComputePieces {
 public:
  static constexpr int kMaxPiecesPerCall = 8;

  // A fresh token for `target`, a call of `tenant`.
  std::string Register(const std::string& tenant, std::weak_ptr<PieceTarget> target);
  void Remove(const std::string& token);
  // The call behind `token` for `tenant`; NOT_FOUND alike for an unknown
  // token, another tenant's and a call that has ended.
  absl::StatusOr<std::shared_ptr<PieceTarget>> Find(const std::string& token,
                                                    const std::string& tenant) const;

 private:
  struct Entry {
    std::string tenant;
    std::weak_ptr<PieceTarget> target;
  };
  mutable absl::Mutex mu_;
  std::map<std::string, Entry> calls_ ABSL_GUARDED_BY(mu_);
};

}  // namespace flce::server

#endif  // FLCE_SERVER_STATE_COMPUTE_PIECES_H_
