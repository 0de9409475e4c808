#include "server/rpc/compute_reactor.h"

#include <algorithm>
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "core/status_macros.h"
#include "server/base/status_mapping.h"
#include "server/handlers/compute_job.h"
#include "server/rpc/message_bytes.h"

namespace flce::server {

namespace {
// Request messages read ahead of the worker. With 2, the next chunk is on
// its way while the worker feeds the engine, and memory stays bounded.
constexpr size_t kMaxQueuedRequests = 2;

// How long after it answered the header a call waits for the pieces it asked
// for to join (a client opens them at once; one that never comes then no
// longer holds the call's rows back).
constexpr absl::Duration kPieceJoinTime = absl::Seconds(10);

// A request message as the job sees it, or why it is none (a message that
// does not parse fails the call).
absl::StatusOr<v1::ComputeRequest> Parse(grpc::ByteBuffer* bytes) {
  v1::ComputeRequest request;
  FLCE_RETURN_IF_ERROR(ParseRequestBytes(bytes, &request));
  return request;
}

}  // namespace

// Shared by the reactor (gRPC's threads), the worker thread and the engine's
// sink. Outlives the reactor: the worker holds it until it is done.
class ComputeStream : public ComputeChannel,
                      public PieceTarget,
                      public std::enable_shared_from_this<ComputeStream> {
 public:
  ComputeStream(const ServiceContext& ctx, grpc::CallbackServerContext* call,
                ComputeReactor* reactor, Principal who, std::unique_ptr<RpcScope> scope)
      : ctx_(ctx),
        who_(std::move(who)),
        scope_(std::move(scope)),
        reactor_(reactor),
        deadline_(absl::FromChrono(call->deadline())),
        // Enough for a few full messages: the engine keeps producing while
        // one is on the wire.
        max_out_bytes_(std::max<int64_t>(4 * ctx.config.max_message_bytes, 16 << 20)) {}

  void Start() {
    {
      absl::MutexLock lock(&mu_);
      read_in_flight_ = true;
    }
    reactor_->StartRead(&request_);
    ctx_.workers->Begin();
    std::thread([self = shared_from_this()] { self->Work(); }).detach();
  }

  // --- reactions -------------------------------------------------------------
  void OnReadDone(bool ok) {
    bool read_more = false;
    {
      absl::MutexLock lock(&mu_);
      read_in_flight_ = false;
      if (!ok) {
        input_closed_ = true;
        return;
      }
      own_.push_back(Parse(&request_));
      request_.Clear();
      // Nothing after a message that does not parse is read.
      if (!own_.back().ok()) input_closed_ = true;
      read_more = ReserveReadLocked();
    }
    if (read_more) IssueRead();
  }

  void OnWriteDone(bool ok) {
    const v1::ComputeResponse* next = nullptr;
    bool finish = false;
    {
      absl::MutexLock lock(&mu_);
      out_bytes_ -= static_cast<int64_t>(out_.front()->ByteSizeLong());
      out_.pop_front();
      if (!ok) {  // the client is gone: nothing more will be written
        cancelled_ = true;
        out_.clear();
        out_bytes_ = 0;
      }
      if (!out_.empty() && !finish_called_) {
        next = out_.front().get();
      } else {
        writing_ = false;
      }
      finish = ReserveFinishLocked();
    }
    if (next != nullptr) StartWriteOf(*next);
    if (finish) reactor_->Finish(finish_status_);
  }

  void OnCancel() {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
  }

  void OnDone() {
    absl::MutexLock lock(&mu_);
    done_ = true;
  }

  // --- ComputeChannel (worker and engine threads) ------------------------------
  absl::StatusOr<std::optional<v1::ComputeRequest>> Next() override {
    std::optional<v1::ComputeRequest> item;
    bool read_more = false;
    std::vector<std::function<void()>> after;  // piece callbacks, run unlocked
    {
      absl::MutexLock lock(&mu_);
      const absl::Condition ready(
          +[](ComputeStream* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu_) {
            return s->cancelled_ || !s->piece_failure_.ok() || s->PickLocked() != kUndecided;
          },
          this);
      for (;;) {
        // Woken at the pieces' join deadline too: those that have not joined
        // by then are waited for no more.
        const absl::Time wake = pieces_join_by_ > absl::Now()
                                    ? std::min(pieces_join_by_, deadline_)
                                    : deadline_;
        if (mu_.AwaitWithDeadline(ready, wake)) break;
        if (absl::Now() >= deadline_) return GoneStatus();
      }
      if (cancelled_) return GoneStatus();
      if (!piece_failure_.ok()) return piece_failure_;
      const int source = PickLocked();
      if (source == kClosed) return std::optional<v1::ComputeRequest>();  // client closed
      std::deque<absl::StatusOr<v1::ComputeRequest>>& queue =
          source == kOwnStream ? own_ : pieces_[source].items;
      if (!queue.front().ok()) return queue.front().status();
      item.emplace(*std::move(queue.front()));
      queue.pop_front();
      if (item->has_hidden() && pieces_allowed_ > 0) {
        int64_t& floor = source == kOwnStream ? own_floor_ : pieces_[source].floor;
        const int64_t rows = RowsInLocked(item->hidden());
        floor = std::max(floor, item->hidden().token_offset() + rows);
        rows_taken_ += rows;
      }
      // The end message comes once every piece that joined has ended and all
      // its rows were taken; none may join after it.
      if (item->has_end()) pieces_closed_ = true;
      if (source != kOwnStream) TookPieceItemLocked(source, &after);
      read_more = ReserveReadLocked();
    }
    for (auto& callback : after) callback();
    if (read_more) IssueRead();
    return item;
  }

  // --- pieces (the job's thread, and the pieces' reactors) ------------------------
  absl::StatusOr<std::string> OpenPieces(int pieces, int64_t row_bytes, int64_t num_tokens,
                                         bool data_plane) override {
    {
      absl::MutexLock lock(&mu_);
      pieces_allowed_ = pieces;
      piece_row_bytes_ = row_bytes;
      piece_call_rows_ = num_tokens;
      pieces_join_by_ = absl::Now() + kPieceJoinTime;
    }
    piece_token_ = ctx_.pieces->Register(who_.tenant, weak_from_this(), data_plane);
    return piece_token_;
  }

  absl::StatusOr<int> JoinPiece(std::function<void(absl::StatusOr<int64_t>)> answer) override {
    absl::MutexLock lock(&mu_);
    if (cancelled_ || finish_wanted_ || pieces_closed_) {
      return absl::FailedPreconditionError(
          "the Compute call no longer takes pieces (its end message arrived, or it ended)");
    }
    if (static_cast<int>(pieces_.size()) >= pieces_allowed_) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the Compute call asked for ", pieces_allowed_, " hidden pieces; all have joined"));
    }
    const int id = static_cast<int>(pieces_.size()) + 1;
    pieces_[id].answer = std::move(answer);
    return id;
  }

  bool OfferPiece(int id, absl::StatusOr<v1::ComputePieceRequest> message,
                  std::function<void()> resume) override {
    std::vector<std::function<void()>> after;
    bool read_more = false;
    {
      absl::MutexLock lock(&mu_);
      Piece& piece = pieces_[id];
      if (piece.answered) return false;
      absl::Status wrong = message.status();
      if (wrong.ok()) {
        switch (message->msg_case()) {
          case v1::ComputePieceRequest::kHidden: {
            piece.rows += RowsInLocked(message->hidden());
            v1::ComputeRequest rows;
            rows.mutable_hidden()->Swap(message->mutable_hidden());
            piece.items.push_back(std::move(rows));
            read_more = piece.items.size() < kMaxQueuedRequests;
            if (!read_more) piece.resume = std::move(resume);
            break;
          }
          case v1::ComputePieceRequest::kEnd:
            if (message->end().num_tokens() != piece.rows) {
              wrong = absl::InvalidArgumentError(absl::StrCat(
                  "hidden piece ", id, "'s end message says ", message->end().num_tokens(),
                  " rows; it sent ", piece.rows));
            } else {
              piece.ended = true;
              if (piece.items.empty()) AnswerPieceLocked(id, piece.rows, &after);
            }
            break;
          default:
            wrong = absl::InvalidArgumentError(absl::StrCat(
                "hidden piece ", id, ": after its token a piece sends hidden chunks and its end"));
        }
      }
      if (!wrong.ok()) {
        // The call fails with it, and lands nothing.
        if (piece_failure_.ok()) piece_failure_ = wrong;
        AnswerPieceLocked(id, wrong, &after);
      }
    }
    for (auto& callback : after) callback();
    return read_more;
  }

  void Send(std::unique_ptr<v1::ComputeResponse> response) override {
    const v1::ComputeResponse* first = nullptr;
    {
      absl::MutexLock lock(&mu_);
      if (cancelled_ || finish_wanted_) return;
      out_bytes_ += static_cast<int64_t>(response->ByteSizeLong());
      out_.push_back(std::move(response));
      if (!writing_) {
        writing_ = true;
        first = out_.front().get();
      }
    }
    if (first != nullptr) StartWriteOf(*first);
  }

  absl::Status CheckAlive() override {
    absl::MutexLock lock(&mu_);
    if (!send_error_.ok()) return send_error_;
    // The deadline counts even before gRPC's cancellation reaches us.
    return cancelled_ || absl::Now() >= deadline_ ? GoneStatus() : absl::OkStatus();
  }

  absl::Status WaitForSent() override {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](ComputeStream* s)
             ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu_) { return s->cancelled_ || s->out_.empty(); },
        this));
    if (!send_error_.ok()) return send_error_;
    return cancelled_ || absl::Now() >= deadline_ ? GoneStatus() : absl::OkStatus();
  }

  absl::Time Deadline() const override { return deadline_; }

  absl::Status WaitForRoom() override {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](ComputeStream* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu_) {
          return s->cancelled_ || s->out_bytes_ <= s->max_out_bytes_;
        },
        this));
    if (cancelled_) return GoneStatus();
    return absl::OkStatus();
  }

 private:
  void Work() {
    absl::Status status;
    {
      ComputeJob job(ctx_, this, who_, scope_.get());
      status = job.Run();
    }  // the job's engine call and buffers are gone before the status is sent
    if (!piece_token_.empty()) ctx_.pieces->Remove(piece_token_);
    RequestFinish(ToGrpcStatus(status));
    ctx_.workers->End();
  }

  // Serializes the response whose turn it is and writes it. It runs where the
  // write is started (the sending thread for the first, gRPC's thread after
  // each write), so the copy into the wire's buffers stays off the thread that
  // checks and posts grad_input.
  void StartWriteOf(const v1::ComputeResponse& response) {
    // The previous write is done with wire_: one write is in flight at a time.
    absl::Status serialized = SerializeMessageBytes(response, &wire_);
    if (serialized.ok()) {
      reactor_->StartWrite(&wire_);
      return;
    }
    {
      // The call must not land with a response missing: WaitForSent says so.
      absl::MutexLock lock(&mu_);
      send_error_ = serialized;
    }
    OnWriteDone(false);
  }

  absl::Status GoneStatus() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (absl::Now() >= deadline_) {
      return absl::DeadlineExceededError("the call's deadline passed before it completed");
    }
    return absl::CancelledError("the client cancelled the call");
  }

  // A read may start when none is outstanding, the queue has room and the
  // call is still going. Marks it as starting, so Finish waits for it.
  bool ReserveReadLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (read_in_flight_ || input_closed_ || cancelled_ || finish_wanted_ ||
        own_.size() >= kMaxQueuedRequests) {
      return false;
    }
    read_in_flight_ = true;
    read_starting_ = true;
    return true;
  }

  void IssueRead() {
    // OnReadDone may run inside StartRead on this very thread: no lock here.
    reactor_->StartRead(&request_);
    bool finish;
    {
      absl::MutexLock lock(&mu_);
      read_starting_ = false;
      finish = ReserveFinishLocked();
    }
    if (finish) reactor_->Finish(finish_status_);
  }

  // Finish may be sent once wanted, with no write in flight and no Start*
  // call under way: after it, OnDone may delete the reactor at any moment.
  bool ReserveFinishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!finish_wanted_ || finish_called_ || writing_ || read_starting_) return false;
    finish_called_ = true;
    return true;
  }

  void RequestFinish(grpc::Status status) {
    bool finish;
    std::vector<std::function<void()>> after;
    {
      absl::MutexLock lock(&mu_);
      finish_wanted_ = true;
      finish_status_ = status;
      if (!status.ok()) {
        // Only the message already on the wire stays.
        while (out_.size() > (writing_ ? 1u : 0u)) {
          out_bytes_ -= static_cast<int64_t>(out_.back()->ByteSizeLong());
          out_.pop_back();
        }
      }
      finish = ReserveFinishLocked();
      for (auto& [id, piece] : pieces_) {
        if (!piece.answered) {
          AnswerPieceLocked(id,
                            absl::AbortedError(absl::StrCat(
                                "the Compute call ended before this piece did: ",
                                status.ok() ? std::string("OK") : status.error_message())),
                            &after);
        }
      }
    }
    for (auto& callback : after) callback();
    scope_->Done(status);
    if (finish) reactor_->Finish(status);
  }

  const ServiceContext& ctx_;
  const Principal who_;
  std::unique_ptr<RpcScope> scope_;  // set up and Done() on the worker thread
  ComputeReactor* reactor_;          // valid until finish_called_ (then OnDone deletes it)
  const absl::Time deadline_;
  const int64_t max_out_bytes_;
  grpc::ByteBuffer request_;  // the read buffer; one read at a time

  // Where the next message for the job comes from: the call's own stream,
  // piece n, or nowhere yet.
  static constexpr int kOwnStream = 0;
  static constexpr int kUndecided = -1;
  static constexpr int kClosed = -2;  // the own stream closed with nothing left
  struct Piece {
    std::function<void(absl::StatusOr<int64_t>)> answer;
    std::function<void()> resume;  // set while the piece waits for room
    // Its hidden chunks, not yet taken by the job.
    std::deque<absl::StatusOr<v1::ComputeRequest>> items;
    int64_t rows = 0;    // rows it sent
    int64_t floor = 0;   // the end of the rows the job took from it last
    bool ended = false;  // its end message arrived
    bool answered = false;
  };

  // Rows go to the job in token order across the streams (each stream sends
  // its own in order): the lowest rows queued go first unless a stream with
  // nothing queued may still send lower ones (the end of the rows it sent
  // last is below them; a piece yet to join may send any). Engines that chunk
  // rows as they come (CUDA's streaming input) then see them as one stream
  // would bring them. The end message comes last, after every piece that
  // joined has ended.
  int PickLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    constexpr int64_t kLast = std::numeric_limits<int64_t>::max();
    auto order = [](const absl::StatusOr<v1::ComputeRequest>& m) -> int64_t {
      if (m.ok() && m->has_hidden()) return m->hidden().token_offset();
      if (m.ok() && m->has_end()) return kLast;
      return -1;  // an error or a misplaced message: to the job at once
    };
    if (own_.empty() && input_closed_) return kClosed;
    if (pieces_allowed_ == 0) return own_.empty() ? kUndecided : kOwnStream;
    int best = kUndecided;
    int64_t lowest = kLast;
    if (!own_.empty()) {
      best = kOwnStream;
      lowest = order(own_.front());
      if (lowest < 0) return kOwnStream;
    }
    for (const auto& [id, piece] : pieces_) {
      if (piece.items.empty()) continue;
      const int64_t at = order(piece.items.front());
      if (at < 0) return id;
      if (best == kUndecided || at < lowest) {
        best = id;
        lowest = at;
      }
    }
    if (best == kUndecided) return kUndecided;
    if (own_.empty() && own_floor_ < lowest) return kUndecided;
    for (const auto& [id, piece] : pieces_) {
      if (piece.items.empty() && !piece.ended && !piece.answered && piece.floor < lowest) {
        return kUndecided;
      }
    }
    // A piece yet to join may send any rows, and the end message must not
    // overtake the rows it brings: both wait for it, for a while.
    const bool may_join = static_cast<int>(pieces_.size()) < pieces_allowed_ && !pieces_closed_ &&
                          absl::Now() < pieces_join_by_;
    if (may_join && (lowest == kLast ? rows_taken_ < piece_call_rows_ : lowest > 0)) {
      return kUndecided;
    }
    return best;
  }

  // Whole rows in a chunk of a call that takes pieces (the job checks the rest).
  int64_t RowsInLocked(const v1::HiddenChunk& chunk) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return static_cast<int64_t>(chunk.data().size()) / piece_row_bytes_;
  }

  // The piece's item was taken: room for its next message, and its answer
  // once its end has come and nothing of it is queued.
  void TookPieceItemLocked(int id, std::vector<std::function<void()>>* after)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Piece& piece = pieces_[id];
    if (piece.resume && piece.items.size() < kMaxQueuedRequests) {
      after->push_back(std::move(piece.resume));
      piece.resume = nullptr;
    }
    if (piece.ended && piece.items.empty() && !piece.answered) {
      AnswerPieceLocked(id, piece.rows, after);
    }
  }

  void AnswerPieceLocked(int id, absl::StatusOr<int64_t> rows,
                         std::vector<std::function<void()>>* after)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Piece& piece = pieces_[id];
    piece.answered = true;
    piece.resume = nullptr;
    after->push_back([answer = std::move(piece.answer), rows = std::move(rows)]() mutable {
      if (answer) answer(std::move(rows));
    });
  }

  absl::Mutex mu_;
  // Parsed messages of the call's own stream; one that does not parse is its
  // error, and last.
  std::deque<absl::StatusOr<v1::ComputeRequest>> own_ ABSL_GUARDED_BY(mu_);
  int64_t own_floor_ ABSL_GUARDED_BY(mu_) = 0;  // the end of the own rows the job took last
  int64_t rows_taken_ ABSL_GUARDED_BY(mu_) = 0;  // by the job, from every stream
  int64_t piece_call_rows_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time pieces_join_by_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  absl::Status piece_failure_ ABSL_GUARDED_BY(mu_);  // the first piece's failure fails the call
  std::string piece_token_;  // set once, before any piece can join
  int pieces_allowed_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t piece_row_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  bool pieces_closed_ ABSL_GUARDED_BY(mu_) = false;
  std::map<int, Piece> pieces_ ABSL_GUARDED_BY(mu_);
  bool read_in_flight_ ABSL_GUARDED_BY(mu_) = false;
  bool read_starting_ ABSL_GUARDED_BY(mu_) = false;
  bool input_closed_ ABSL_GUARDED_BY(mu_) = false;
  // Responses to write; the front one is on the wire (in wire_) while writing_.
  std::deque<std::unique_ptr<v1::ComputeResponse>> out_ ABSL_GUARDED_BY(mu_);
  grpc::ByteBuffer wire_;  // the write in flight; touched only by its StartWriteOf
  int64_t out_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status send_error_ ABSL_GUARDED_BY(mu_);
  bool finish_wanted_ ABSL_GUARDED_BY(mu_) = false;
  bool finish_called_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status finish_status_;  // written before finish_called_, read after
  bool done_ ABSL_GUARDED_BY(mu_) = false;
};

ComputeReactor::ComputeReactor(const ServiceContext& ctx, grpc::CallbackServerContext* call,
                               Principal who, std::unique_ptr<RpcScope> scope)
    : stream_(std::make_shared<ComputeStream>(ctx, call, this, std::move(who), std::move(scope))) {
  stream_->Start();
}

void ComputeReactor::OnReadDone(bool ok) { stream_->OnReadDone(ok); }
void ComputeReactor::OnWriteDone(bool ok) { stream_->OnWriteDone(ok); }
void ComputeReactor::OnCancel() { stream_->OnCancel(); }

void ComputeReactor::OnDone() {
  stream_->OnDone();
  delete this;
}

}  // namespace flce::server
