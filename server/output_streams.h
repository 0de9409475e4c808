// A Compute call's grad_input sent back on a second call, ComputeOutput,
// which the client opens on a connection of its own: hidden then goes up and
// grad_input comes down on two connections at once (one HTTP/2 connection is
// served by one thread at each end, and that thread is what limits a call
// that moves hundreds of MiB both ways).
//
// The two calls meet here by (tenant, ComputeHeader.output_token), in either
// order. An OutputStream is the queue between them: the Compute call's job
// sends into it and waits for room or for everything to be written; the
// ComputeOutput reactor writes from it. The job closes it when its call is
// over: the output call then ends with OK once every message was written,
// or with ABORTED when the Compute call failed. An output call that goes away
// makes the job's next wait fail, so the Compute call fails and lands nothing.
#ifndef FLCE_SERVER_OUTPUT_STREAMS_H_
#define FLCE_SERVER_OUTPUT_STREAMS_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "flce/v1/flce.pb.h"
#include "grpcpp/support/status.h"

namespace flce::server {

// The ComputeOutput call as the stream drives it. Neither is called again
// once End was.
class OutputWriter {
 public:
  virtual ~OutputWriter() = default;
  virtual void Write(const v1::ComputeResponse* response) = 0;
  virtual void End(const grpc::Status& status) = 0;
};

// ComputeHeader.output_token and ComputeOutputRequest.output_token: 16 to 64
// bytes (random, so that nobody else's call can name it).
absl::Status ValidateOutputToken(const std::string& token, const char* field);

class OutputStream {
 public:
  // attach_timeout: how long after its creation the other half may come.
  OutputStream(std::string key, absl::Duration attach_timeout, int64_t max_queued_bytes);

  // --- the Compute call's side -------------------------------------------
  // Queues a response; dropped once the output call is gone or ended.
  void Send(std::unique_ptr<v1::ComputeResponse> response);
  // Block while more than the queue bound is waiting to be written. They fail
  // with CANCELLED once the output call went away, FAILED_PRECONDITION when no
  // ComputeOutput call arrived by the attach deadline, DEADLINE_EXCEEDED at
  // `deadline`, or with what `alive` returns (polled: the Compute call's own
  // cancellation).
  absl::Status WaitForRoom(absl::Time deadline, const std::function<absl::Status()>& alive);
  // ...until every queued response has been written.
  absl::Status WaitForSent(absl::Time deadline, const std::function<absl::Status()>& alive);
  // The Compute call is over with `status` (the first Close counts): the
  // output call ends with OK once every queued message is written, or with
  // ABORTED naming that status.
  void Close(const absl::Status& status);

  // --- the ComputeOutput call's side (after OutputStreams::Attach) ----------
  // Writes what the Compute call queued, or ends when that call is over.
  void Start() { Pump(); }
  void OnWriteDone(bool ok);
  void OnCancel();

  const std::string& key() const { return key_; }

 private:
  friend class OutputStreams;
  // Under OutputStreams' lock: the rendezvous.
  void Claim();
  void AttachWriter(OutputWriter* writer);
  bool claimed() const;
  bool parked() const;  // a writer waits for a Compute call
  bool Expire(absl::Time now);  // a parked writer past the attach deadline ends

  template <typename Ready>
  absl::Status Wait(absl::Time deadline, const std::function<absl::Status()>& alive, Ready ready);
  // Starts the next write or the end where one is due; call without mu_ held.
  void Pump();

  const std::string key_;
  const absl::Duration attach_timeout_;
  const absl::Time attach_by_;
  const int64_t max_queued_bytes_;

  mutable absl::Mutex mu_;
  bool claimed_ ABSL_GUARDED_BY(mu_) = false;     // a Compute call named the token
  OutputWriter* writer_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool attached_ ABSL_GUARDED_BY(mu_) = false;    // a ComputeOutput call came
  std::deque<std::unique_ptr<v1::ComputeResponse>> out_ ABSL_GUARDED_BY(mu_);
  int64_t out_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;     // a Write is in flight or starting
  bool gone_ ABSL_GUARDED_BY(mu_) = false;        // the output call was cancelled or broke
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status close_status_ ABSL_GUARDED_BY(mu_);
  bool ended_ ABSL_GUARDED_BY(mu_) = false;       // End was (or is being) called
  grpc::Status end_status_ ABSL_GUARDED_BY(mu_);
};

class OutputStreams {
 public:
  // attach_timeout: how long either call waits for the other.
  // max_parked_per_tenant: ComputeOutput calls of one tenant waiting for their
  // Compute call at once.
  OutputStreams(absl::Duration attach_timeout, int64_t max_parked_per_tenant,
                int64_t max_queued_bytes);

  // The Compute call's side: the stream for its token (ALREADY_EXISTS when
  // another Compute call named it).
  absl::StatusOr<std::shared_ptr<OutputStream>> Claim(const std::string& tenant,
                                                      const std::string& token);
  // The ComputeOutput call's side; the caller then Start()s the stream
  // (ALREADY_EXISTS when another ComputeOutput call named the token,
  // RESOURCE_EXHAUSTED past max_parked_per_tenant).
  absl::StatusOr<std::shared_ptr<OutputStream>> Attach(const std::string& tenant,
                                                       const std::string& token,
                                                       OutputWriter* writer);
  // Drops a stream that is still waiting for its other half (its call went).
  void Forget(const OutputStream& stream);
  // Ends ComputeOutput calls whose Compute call did not come in time (NOT_FOUND)
  // and drops entries nobody attached to; returns how many went.
  int64_t Sweep(absl::Time now);
  // Entries waiting for their other half.
  int64_t waiting() const;

 private:
  static std::string Key(const std::string& tenant, const std::string& token);

  const absl::Duration attach_timeout_;
  const int64_t max_parked_per_tenant_;
  const int64_t max_queued_bytes_;
  struct Waiting {
    std::string tenant;
    std::shared_ptr<OutputStream> stream;
  };
  mutable absl::Mutex mu_;
  // key -> stream, until both halves met (then each half holds it).
  std::map<std::string, Waiting> waiting_ ABSL_GUARDED_BY(mu_);
};

}  // namespace flce::server

#endif  // FLCE_SERVER_OUTPUT_STREAMS_H_
