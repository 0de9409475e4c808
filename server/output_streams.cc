#include "server/output_streams.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "kernels/status_macros.h"
#include "server/status_mapping.h"

namespace flce::server {
namespace {

constexpr size_t kMinTokenBytes = 16;
constexpr size_t kMaxTokenBytes = 64;
// How often a wait looks at the Compute call's own liveness.
constexpr absl::Duration kAlivePoll = absl::Milliseconds(100);

}  // namespace

absl::Status ValidateOutputToken(const std::string& token, const char* field) {
  if (token.size() < kMinTokenBytes || token.size() > kMaxTokenBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, " has ", token.size(), " bytes; it must have ", kMinTokenBytes, " to ",
        kMaxTokenBytes, " (random bytes, new for every call)"));
  }
  return absl::OkStatus();
}

OutputStream::OutputStream(std::string key, absl::Duration attach_timeout,
                           int64_t max_queued_bytes)
    : key_(std::move(key)),
      attach_timeout_(attach_timeout),
      attach_by_(absl::Now() + attach_timeout),
      max_queued_bytes_(max_queued_bytes) {}

void OutputStream::Claim() {
  absl::MutexLock lock(&mu_);
  claimed_ = true;
}

void OutputStream::AttachWriter(OutputWriter* writer) {
  absl::MutexLock lock(&mu_);
  writer_ = writer;
  attached_ = true;
}

bool OutputStream::claimed() const {
  absl::MutexLock lock(&mu_);
  return claimed_;
}

bool OutputStream::parked() const {
  absl::MutexLock lock(&mu_);
  return attached_ && !claimed_ && !ended_;
}

bool OutputStream::Expire(absl::Time now) {
  {
    absl::MutexLock lock(&mu_);
    if (claimed_ || !attached_ || ended_ || now < attach_by_) return false;
    closed_ = true;
    close_status_ = absl::NotFoundError(absl::StrCat(
        "no Compute call named this output_token (ComputeHeader.output_token) within ",
        absl::FormatDuration(attach_timeout_), " of this ComputeOutput call"));
  }
  Pump();
  return true;
}

void OutputStream::Send(std::unique_ptr<v1::ComputeResponse> response) {
  {
    absl::MutexLock lock(&mu_);
    if (gone_ || closed_) return;
    out_bytes_ += static_cast<int64_t>(response->ByteSizeLong());
    out_.push_back(std::move(response));
  }
  Pump();
}

template <typename Ready>
absl::Status OutputStream::Wait(absl::Time deadline, const std::function<absl::Status()>& alive,
                                Ready ready) {
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      const absl::Time now = absl::Now();
      if (gone_) {
        return absl::CancelledError(
            "the ComputeOutput call carrying this call's grad_input was cancelled or its "
            "connection broke: nothing landed");
      }
      if (ready()) return absl::OkStatus();
      if (!attached_ && now >= attach_by_) {
        return absl::FailedPreconditionError(absl::StrCat(
            "ComputeHeader.output_token: no ComputeOutput call with this token arrived within ",
            absl::FormatDuration(attach_timeout_),
            " of the header: nothing landed; open it (on a connection of its own) when the "
            "Compute call starts, or leave output_token empty to get grad_input on the Compute "
            "call"));
      }
      if (now >= deadline) {
        return absl::DeadlineExceededError("the call's deadline passed before it completed");
      }
      absl::Time until = std::min(deadline, now + kAlivePoll);
      if (!attached_) until = std::min(until, attach_by_);
      struct Arg {
        OutputStream* self;
        Ready* ready;
      } arg{this, &ready};
      mu_.AwaitWithDeadline(absl::Condition(
                                +[](Arg* a) ABSL_NO_THREAD_SAFETY_ANALYSIS {
                                  return a->self->gone_ || (*a->ready)();
                                },
                                &arg),
                            until);
    }
    if (absl::Status status = alive(); !status.ok()) return status;
  }
}

absl::Status OutputStream::WaitForRoom(absl::Time deadline,
                                       const std::function<absl::Status()>& alive) {
  return Wait(deadline, alive, [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return out_bytes_ <= max_queued_bytes_;
  });
}

absl::Status OutputStream::WaitForSent(absl::Time deadline,
                                       const std::function<absl::Status()>& alive) {
  return Wait(deadline, alive,
              [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return out_.empty(); });
}

void OutputStream::Close(const absl::Status& status) {
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return;
    closed_ = true;
    close_status_ = status;
    if (!status.ok()) {
      // Only the message on the wire stays (gRPC reads it until OnWriteDone).
      while (out_.size() > (writing_ ? 1u : 0u)) {
        out_bytes_ -= static_cast<int64_t>(out_.back()->ByteSizeLong());
        out_.pop_back();
      }
    }
  }
  Pump();
}

void OutputStream::OnWriteDone(bool ok) {
  {
    absl::MutexLock lock(&mu_);
    out_bytes_ -= static_cast<int64_t>(out_.front()->ByteSizeLong());
    out_.pop_front();
    writing_ = false;
    if (!ok) gone_ = true;
    if (gone_) {
      out_.clear();
      out_bytes_ = 0;
    }
  }
  Pump();
}

void OutputStream::OnCancel() {
  {
    absl::MutexLock lock(&mu_);
    gone_ = true;
    while (out_.size() > (writing_ ? 1u : 0u)) {
      out_bytes_ -= static_cast<int64_t>(out_.back()->ByteSizeLong());
      out_.pop_back();
    }
  }
  Pump();
}

void OutputStream::Pump() {
  OutputWriter* writer = nullptr;
  const v1::ComputeResponse* next = nullptr;
  grpc::Status end_status;
  {
    absl::MutexLock lock(&mu_);
    if (writer_ == nullptr || ended_ || writing_) return;
    if (!gone_ && !out_.empty()) {
      writing_ = true;
      next = out_.front().get();
    } else if (gone_) {
      end_status = grpc::Status(grpc::StatusCode::CANCELLED, "the client cancelled ComputeOutput");
    } else if (closed_ && close_status_.ok()) {
      end_status = grpc::Status::OK;
    } else if (closed_ && !claimed_) {
      end_status = ToGrpcStatus(close_status_);  // expired while parked
    } else if (closed_) {
      end_status = grpc::Status(
          grpc::StatusCode::ABORTED,
          absl::StrCat("the Compute call failed (", absl::StatusCodeToString(close_status_.code()),
                       ": ", close_status_.message(), "); its own status says the same"));
    } else {
      return;  // waiting for messages or the close
    }
    writer = writer_;
    if (next == nullptr) {
      ended_ = true;
      writer_ = nullptr;  // the reactor may be deleted once End returns
    }
  }
  if (next != nullptr) {
    writer->Write(next);
  } else {
    writer->End(end_status);
  }
}

OutputStreams::OutputStreams(absl::Duration attach_timeout, int64_t max_parked_per_tenant,
                             int64_t max_queued_bytes)
    : attach_timeout_(attach_timeout),
      max_parked_per_tenant_(max_parked_per_tenant),
      max_queued_bytes_(max_queued_bytes) {}

std::string OutputStreams::Key(const std::string& tenant, const std::string& token) {
  // Tenant names hold no NUL: the pair is unambiguous.
  return absl::StrCat(tenant, std::string(1, '\0'), token);
}

absl::StatusOr<std::shared_ptr<OutputStream>> OutputStreams::Claim(const std::string& tenant,
                                                                   const std::string& token) {
  FLCE_RETURN_IF_ERROR(ValidateOutputToken(token, "ComputeHeader.output_token"));
  absl::MutexLock lock(&mu_);
  const std::string key = Key(tenant, token);
  auto it = waiting_.find(key);
  if (it != waiting_.end()) {
    std::shared_ptr<OutputStream> stream = it->second.stream;
    if (stream->claimed()) {
      return absl::AlreadyExistsError(
          "ComputeHeader.output_token is already named by another Compute call: use new random "
          "bytes for every call");
    }
    waiting_.erase(it);
    stream->Claim();
    return stream;
  }
  auto stream = std::make_shared<OutputStream>(key, attach_timeout_,
                                               max_queued_bytes_);
  stream->Claim();
  waiting_.emplace(key, Waiting{tenant, stream});
  return stream;
}

absl::StatusOr<std::shared_ptr<OutputStream>> OutputStreams::Attach(const std::string& tenant,
                                                                    const std::string& token,
                                                                    OutputWriter* writer) {
  FLCE_RETURN_IF_ERROR(ValidateOutputToken(token, "ComputeOutputRequest.output_token"));
  std::shared_ptr<OutputStream> stream;
  {
    absl::MutexLock lock(&mu_);
    const std::string key = Key(tenant, token);
    auto it = waiting_.find(key);
    if (it != waiting_.end()) {
      if (!it->second.stream->claimed()) {
        return absl::AlreadyExistsError(
            "another ComputeOutput call already waits with this output_token");
      }
      stream = it->second.stream;
      waiting_.erase(it);
    } else {
      const int64_t parked = std::count_if(waiting_.begin(), waiting_.end(), [&](const auto& e) {
        return e.second.tenant == tenant && e.second.stream->parked();
      });
      if (parked >= max_parked_per_tenant_) {
        return absl::ResourceExhaustedError(absl::StrCat(
            parked, " ComputeOutput calls of this caller already wait for their Compute call; "
                    "start those calls first"));
      }
      stream = std::make_shared<OutputStream>(key, attach_timeout_,
                                              max_queued_bytes_);
      waiting_.emplace(key, Waiting{tenant, stream});
    }
    stream->AttachWriter(writer);
  }
  return stream;
}

void OutputStreams::Forget(const OutputStream& stream) {
  absl::MutexLock lock(&mu_);
  auto it = waiting_.find(stream.key());
  if (it != waiting_.end() && it->second.stream.get() == &stream) waiting_.erase(it);
}

int64_t OutputStreams::Sweep(absl::Time now) {
  std::vector<std::shared_ptr<OutputStream>> gone;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = waiting_.begin(); it != waiting_.end();) {
      OutputStream& stream = *it->second.stream;
      bool drop;
      {
        absl::MutexLock stream_lock(&stream.mu_);
        // Past the deadline nobody else can come: a parked output ends, a
        // Compute call's entry goes (the call fails or has failed by itself).
        drop = now >= stream.attach_by_ || stream.ended_;
      }
      if (drop) {
        gone.push_back(it->second.stream);
        it = waiting_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (const auto& stream : gone) stream->Expire(now);
  return static_cast<int64_t>(gone.size());
}

int64_t OutputStreams::waiting() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(waiting_.size());
}

}  // namespace flce::server
