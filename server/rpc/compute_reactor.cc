#include "server/rpc/compute_reactor.h"

#include <algorithm>
#include <deque>
#include <optional>
#include <thread>
#include <utility>

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
class ComputeStream : public ComputeChannel, public std::enable_shared_from_this<ComputeStream> {
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
      input_.push_back(Parse(&request_));
      request_.Clear();
      // Nothing after a message that does not parse is read.
      if (!input_.back().ok()) input_closed_ = true;
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
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](ComputeStream* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu_) {
            return s->cancelled_ || !s->input_.empty() || s->input_closed_;
          },
          this));
      if (cancelled_) return GoneStatus();
      if (input_.empty()) return std::optional<v1::ComputeRequest>();  // client closed
      if (!input_.front().ok()) return input_.front().status();
      item.emplace(*std::move(input_.front()));
      input_.pop_front();
      read_more = ReserveReadLocked();
    }
    if (read_more) IssueRead();
    return item;
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
        input_.size() >= kMaxQueuedRequests) {
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
    }
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

  absl::Mutex mu_;
  // Parsed request messages; one that does not parse is its error, and last.
  std::deque<absl::StatusOr<v1::ComputeRequest>> input_ ABSL_GUARDED_BY(mu_);
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
