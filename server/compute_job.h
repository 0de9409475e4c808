// The work of one Compute call, on its worker thread, apart from the gRPC
// plumbing: validate the header, take a head snapshot and a session slot,
// stream hidden chunks into the engine, then commit the staged grad_W and
// send token outputs and the summary. Run() leaves nothing behind on failure:
// the engine call is destroyed, the staging buffer dropped, the slot freed.
#ifndef FLCE_SERVER_COMPUTE_JOB_H_
#define FLCE_SERVER_COMPUTE_JOB_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "flce/v1/flce.pb.h"
#include "kernels/engine.h"
#include "server/head_registry.h"
#include "server/service_context.h"
#include "server/session_store.h"
#include "server/validation.h"

namespace flce::server {

// The transport as the job sees it.
class ComputeChannel {
 public:
  virtual ~ComputeChannel() = default;
  // The next request message; nullopt once the client closed its side;
  // CANCELLED or DEADLINE_EXCEEDED once the call is gone.
  virtual absl::StatusOr<std::optional<v1::ComputeRequest>> Next() = 0;
  // Queues a response (from any thread, the engine's included).
  virtual void Send(std::unique_ptr<v1::ComputeResponse> response) = 0;
  // Blocks while the queued responses exceed the output bound, so that a
  // client that does not read cannot make the server buffer a whole request.
  virtual absl::Status WaitForRoom() = 0;
  // CANCELLED or DEADLINE_EXCEEDED once the call is gone, else OK.
  virtual absl::Status CheckAlive() = 0;
  // Blocks until every queued response has been written (or the call is
  // gone); then as CheckAlive.
  virtual absl::Status WaitForSent() = 0;
};

class ComputeJob {
 public:
  // scope: the call's log line and start time; outlives the job.
  ComputeJob(const ServiceContext& ctx, ComputeChannel* channel, const Principal& who,
             RpcScope* scope);
  ~ComputeJob();

  absl::Status Run();

 private:
  absl::Status Setup(const v1::ComputeHeader& header);
  absl::Status AddChunk(const v1::HiddenChunk& chunk);
  absl::Status Complete();
  void OnGradInput(int64_t token_offset, int64_t rows, std::string data);
  void SendTokenOutputs(const ComputeResult& result);
  void Abandon();

  const ServiceContext& ctx_;
  ComputeChannel* channel_;
  const Principal& who_;
  RpcScope* scope_;
  absl::Time start_;

  v1::ComputeHeader header_;
  HeadEntry head_;
  ComputeSpec spec_;
  std::string request_id_;
  std::string session_id_;
  bool forward_only_ = false;
  bool deferred_ = false;
  std::shared_ptr<Session> session_;
  bool slot_held_ = false;  // BeginContribution took a pending slot
  BeginResult begin_;       // replay or not
  std::unique_ptr<GradBuffer> staging_;
  std::unique_ptr<ComputeCall> call_;
  std::optional<HiddenRowTracker> rows_;
  int64_t row_bytes_ = 0;
};

}  // namespace flce::server

#endif  // FLCE_SERVER_COMPUTE_JOB_H_
