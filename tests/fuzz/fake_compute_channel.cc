#include "tests/fuzz/fake_compute_channel.h"

#include <utility>

namespace flce::fuzz {

absl::Status FakeComputeChannel::EndOfStream() {
  closed_ = true;
  if (!behaviour_.cancel_at_end) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  gone_ = true;
  return absl::CancelledError("the client cancelled the call");
}

absl::StatusOr<std::optional<v1::ComputeRequest>> FakeComputeChannel::Next() {
  {
    absl::MutexLock lock(&mu_);
    if (gone_) return absl::CancelledError("the client cancelled the call");
  }
  if (!closed_ && next_ < records_.size()) {
    absl::string_view bytes = records_[next_++];
    v1::ComputeRequest request;
    if (request.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) return request;
    closed_ = true;
    return absl::InvalidArgumentError(
        "a request message does not parse as flce.v1.ComputeRequest: nothing landed");
  }
  absl::Status end = EndOfStream();
  if (!end.ok()) return end;
  return std::optional<v1::ComputeRequest>();
}

void FakeComputeChannel::Send(std::unique_ptr<v1::ComputeResponse> response) {
  absl::MutexLock lock(&mu_);
  if (sent_.summary.has_value()) ++sent_.after_summary;
  switch (response->msg_case()) {
    case v1::ComputeResponse::kGradInput: {
      const v1::GradInputChunk& c = response->grad_input();
      sent_.grad_input.push_back(
          {c.token_offset(), c.num_tokens(), {static_cast<int64_t>(c.data().size())}});
      break;
    }
    case v1::ComputeResponse::kTokenOutputs: {
      const v1::TokenOutputsChunk& c = response->token_outputs();
      sent_.token_outputs.push_back(
          {c.token_offset(),
           c.num_tokens(),
           {static_cast<int64_t>(c.loss().size()), static_cast<int64_t>(c.logprob().size()),
            static_cast<int64_t>(c.entropy().size()), static_cast<int64_t>(c.correct().size())}});
      break;
    }
    case v1::ComputeResponse::kSummary:
      sent_.summary = response->summary();
      break;
    default:
      ++sent_.empty;
      break;
  }
}

absl::Status FakeComputeChannel::WaitForRoom() {
  absl::MutexLock lock(&mu_);
  if (++room_calls_ == behaviour_.fail_room_at) gone_ = true;
  return gone_ ? absl::CancelledError("the client cancelled the call") : absl::OkStatus();
}

absl::Status FakeComputeChannel::CheckAlive() {
  absl::MutexLock lock(&mu_);
  return gone_ ? absl::CancelledError("the client cancelled the call") : absl::OkStatus();
}

absl::Status FakeComputeChannel::WaitForSent() {
  absl::MutexLock lock(&mu_);
  if (behaviour_.gone_before_sent) gone_ = true;
  return gone_ ? absl::CancelledError("the client cancelled the call") : absl::OkStatus();
}

SentLog FakeComputeChannel::sent() const {
  absl::MutexLock lock(&mu_);
  return sent_;
}

}  // namespace flce::fuzz
