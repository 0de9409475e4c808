// A ComputeChannel over recorded bytes, as the server's Compute stream
// delivers them: each record is parsed as one flce.v1.ComputeRequest, and a
// record that does not parse is an INVALID_ARGUMENT error and the last thing
// read (the stream parses its request bytes itself; rpc/compute_reactor.h).
// Responses are kept in outline (offsets, sizes, the summary) for the
// invariant checks.
#ifndef FLCE_TESTS_FUZZ_FAKE_COMPUTE_CHANNEL_H_
#define FLCE_TESTS_FUZZ_FAKE_COMPUTE_CHANNEL_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "flce/v1/flce.pb.h"
#include "server/handlers/compute_job.h"

namespace flce::fuzz {

struct ChannelBehaviour {
  bool cancel_at_end = false;     // the stream ends in a cancellation, not a half-close
  bool gone_before_sent = false;  // WaitForSent finds the client gone
  int fail_room_at = 0;           // the k-th WaitForRoom finds the client gone; 0 = never
};

struct SentChunk {
  int64_t token_offset = 0;
  int64_t num_tokens = 0;
  std::vector<int64_t>
      bytes;  // grad_input: {data}; token outputs: {loss, logprob, entropy, correct}
};

struct SentLog {
  std::vector<SentChunk> grad_input;
  std::vector<SentChunk> token_outputs;
  std::optional<v1::ComputeSummary> summary;
  int64_t after_summary = 0;  // messages sent after the summary
  int64_t empty = 0;          // messages with no oneof case set
};

class FakeComputeChannel : public server::ComputeChannel {
 public:
  FakeComputeChannel(std::vector<absl::string_view> records, ChannelBehaviour behaviour)
      : records_(std::move(records)), behaviour_(behaviour) {}

  absl::StatusOr<std::optional<v1::ComputeRequest>> Next() override;
  void Send(std::unique_ptr<v1::ComputeResponse> response) override;
  absl::Status WaitForRoom() override;
  absl::Status CheckAlive() override;
  absl::Status WaitForSent() override;

  SentLog sent() const;

 private:
  absl::Status EndOfStream();

  const std::vector<absl::string_view> records_;
  const ChannelBehaviour behaviour_;
  // Next() runs on the job's thread only; Send() also on the engine's.
  size_t next_ = 0;
  bool closed_ = false;
  mutable absl::Mutex mu_;
  bool gone_ ABSL_GUARDED_BY(mu_) = false;  // the call is cancelled from here on
  int room_calls_ ABSL_GUARDED_BY(mu_) = 0;
  SentLog sent_ ABSL_GUARDED_BY(mu_);
};

}  // namespace flce::fuzz

#endif  // FLCE_TESTS_FUZZ_FAKE_COMPUTE_CHANNEL_H_
