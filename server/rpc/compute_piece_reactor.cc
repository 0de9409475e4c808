#include "server/rpc/compute_piece_reactor.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "server/base/status_mapping.h"
#include "server/rpc/message_bytes.h"

namespace flce::server {

// Reads and the finish, from gRPC's threads and the call's: a read is never
// started after Finish, and Finish never runs while a StartRead is being
// issued (after Finish, OnDone may delete the reactor at any moment).
struct ComputePieceReactor::Link {
  absl::Mutex mu;
  ComputePieceReactor* reactor ABSL_GUARDED_BY(mu) = nullptr;
  int starting ABSL_GUARDED_BY(mu) = 0;  // StartRead calls under way
  bool end_wanted ABSL_GUARDED_BY(mu) = false;
  bool finished ABSL_GUARDED_BY(mu) = false;
  grpc::Status status ABSL_GUARDED_BY(mu);

  void IssueRead() {
    ComputePieceReactor* r;
    {
      absl::MutexLock lock(&mu);
      if (reactor == nullptr || end_wanted) return;
      r = reactor;
      ++starting;
    }
    r->StartRead(&r->request_);  // OnReadDone may run inside it
    {
      absl::MutexLock lock(&mu);
      --starting;
    }
    FinishIfDue();
  }

  // The RPC's status (the response is already written for OK); sent once.
  void RequestEnd(grpc::Status end) {
    {
      absl::MutexLock lock(&mu);
      if (end_wanted) return;
      end_wanted = true;
      status = std::move(end);
    }
    FinishIfDue();
  }

  void FinishIfDue() {
    ComputePieceReactor* r;
    grpc::Status end;
    {
      absl::MutexLock lock(&mu);
      if (!end_wanted || finished || starting > 0 || reactor == nullptr) return;
      finished = true;
      r = reactor;
      end = status;
    }
    r->scope_->Done(end);
    r->Finish(end);
  }
};

ComputePieceReactor::ComputePieceReactor(const ServiceContext& ctx, grpc::ByteBuffer* response,
                                         Principal who, std::unique_ptr<RpcScope> scope)
    : ctx_(ctx),
      response_(response),
      who_(std::move(who)),
      scope_(std::move(scope)),
      link_(std::make_shared<Link>()) {
  {
    absl::MutexLock lock(&link_->mu);
    link_->reactor = this;
  }
  link_->IssueRead();
}

void ComputePieceReactor::OnReadDone(bool ok) {
  v1::ComputePieceRequest message;
  absl::Status parsed =
      ok ? ParseRequestBytes(&request_, &message)
         : absl::InvalidArgumentError("the stream ended without its end message");
  request_.Clear();
  if (call_ == nullptr) {  // the first message: the token
    if (!parsed.ok()) {
      End(parsed);
    } else if (message.msg_case() != v1::ComputePieceRequest::kToken) {
      End(absl::InvalidArgumentError(
          "a ComputePiece stream starts with the token of its call (PiecesOpened.token)"));
    } else {
      Join(message.token());
    }
    return;
  }
  if (ended_input_) {
    // Only the close may follow the end message.
    if (ok) {
      call_->OfferPiece(piece_,
                        absl::InvalidArgumentError(absl::StrCat(
                            "hidden piece ", piece_, ": a message after its end message")),
                        nullptr);
    }
    return;
  }
  absl::StatusOr<v1::ComputePieceRequest> offered = std::move(message);
  if (!parsed.ok()) {
    offered = absl::Status(parsed.code(),
                           absl::StrCat("hidden piece ", piece_, ": ", parsed.message()));
  }
  ended_input_ = offered.ok() && offered->has_end();
  std::weak_ptr<Link> link = link_;
  const bool more = call_->OfferPiece(piece_, std::move(offered), [link] {
    if (auto held = link.lock()) held->IssueRead();
  });
  // After the end message one more read sees the close (or a stray message).
  if (more || ended_input_) link_->IssueRead();
}

void ComputePieceReactor::OnCancel() {
  if (call_ != nullptr) {
    // Gone before the call took its rows: the call fails (it ignores this
    // once it has answered the piece).
    call_->OfferPiece(piece_,
                      absl::CancelledError(absl::StrCat(
                          "hidden piece ", piece_, " was cancelled before the call took its rows")),
                      nullptr);
  } else {
    End(absl::CancelledError("the client cancelled the piece"));
  }
}

void ComputePieceReactor::Join(const std::string& token) {
  absl::StatusOr<std::shared_ptr<PieceTarget>> call =
      ctx_.pieces != nullptr ? ctx_.pieces->Find(token, who_.tenant)
                             : absl::NotFoundError("this server takes no pieces");
  if (!call.ok()) {
    End(call.status());
    return;
  }
  std::weak_ptr<Link> link = link_;
  grpc::ByteBuffer* response = response_;
  absl::StatusOr<int> piece =
      (*call)->JoinPiece([link, response](absl::StatusOr<int64_t> rows) {
        // The response buffer lives until Finish, which only this answer sends.
        auto held = link.lock();
        if (held == nullptr) return;
        if (!rows.ok()) {
          held->RequestEnd(ToGrpcStatus(rows.status()));
          return;
        }
        v1::ComputePieceResponse answer;
        answer.set_rows(*rows);
        held->RequestEnd(ToGrpcStatus(SerializeMessageBytes(answer, response)));
      });
  if (!piece.ok()) {
    End(piece.status());
    return;
  }
  call_ = *std::move(call);
  piece_ = *piece;
  scope_->set_request_id(absl::StrCat("piece ", piece_));
  link_->IssueRead();
}

void ComputePieceReactor::End(const absl::Status& status) {
  link_->RequestEnd(ToGrpcStatus(status));
}

void ComputePieceReactor::OnDone() {
  {
    absl::MutexLock lock(&link_->mu);
    link_->reactor = nullptr;
  }
  delete this;
}

}  // namespace flce::server
