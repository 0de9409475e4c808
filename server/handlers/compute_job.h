// The work of one Compute call, on its worker thread, apart from the gRPC
// plumbing: validate the header, take a head snapshot, a session slot and
// staging memory (waiting for it when all is in use), stream hidden chunks
// into the engine, and on the explicit end-of-input message check that every
// output is finite, land (or stage) grad_W and send token outputs and the
// summary. A stream that ends any other way lands nothing. Run() leaves
// nothing behind on failure: the engine call is destroyed, the staging buffer
// and its memory released, the slot freed.
#ifndef FLCE_SERVER_HANDLERS_COMPUTE_JOB_H_
#define FLCE_SERVER_HANDLERS_COMPUTE_JOB_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "flce/v1/flce.pb.h"
#include "kernels/engine.h"
#include "server/handlers/grad_input_sender.h"
#include "server/handlers/service_context.h"
#include "server/state/head_registry.h"
#include "server/state/session_store.h"
#include "server/state/shared_regions.h"
#include "server/validate/validation.h"

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
  // When the client stops waiting for the call.
  virtual absl::Time Deadline() const { return absl::InfiniteFuture(); }
  // Lets up to `pieces` ComputePiece streams (with `data_plane`, one
  // data-plane connection) join with rows of `row_bytes` of a call of
  // `num_tokens`; the token to hand the client. Their rows come out of Next()
  // among the call's own, and the end message only after every piece that
  // joined has ended.
  virtual absl::StatusOr<std::string> OpenPieces(int pieces, int64_t row_bytes,
                                                 int64_t num_tokens, bool data_plane) {
    return absl::FailedPreconditionError("this call takes no hidden pieces");
  }
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
  // Waits while an optimizer step rewrites the head, then holds head_use_.
  absl::Status EnterHead(const std::string& head_id);
  absl::Status TakeStaging(const HeadSpec& head_spec);
  // After the header is accepted: the token ComputePiece streams or the
  // data-plane connection present (ComputeResponse.pieces) when the header
  // asks for hidden_pieces or data_plane.
  absl::Status OpenPieces(const v1::ComputeHeader& header);
  // flce_compute_calls_total and the request log's transport= for this call.
  void RecordTransport();
  // The end message is the last one: nothing lands until the client has
  // half-closed after it, and a message that follows it fails the call.
  absl::Status ExpectHalfClose();
  absl::Status AddChunk(const v1::HiddenChunk& chunk);
  // Rows [token_offset, ...) of hidden, checked and handed to the engine.
  absl::Status AddRows(int64_t token_offset, absl::string_view data);
  // ComputeHeader.shared: the region, its ranges checked; then every row.
  absl::Status OpenSharedRegion(const v1::SharedHidden& shared);
  // SharedHidden.targets_offset: the targets read from the region into
  // header_.targets, before anything else looks at them.
  absl::Status TakeTargetsFromRegion();
  absl::Status FindRegion(const v1::SharedHidden& shared);
  absl::Status AddRowsFromRegion();
  // A region the GPU reads directly (cuda_ipc, or shm page-locked for it):
  // the engine copies and checks on the GPU.
  absl::Status AddRowsFromDevice();
  // flce_shared_memory_bytes_total or flce_cuda_ipc_bytes_total, by the region's kind.
  void AddLocalTransportBytes(const char* direction, int64_t bytes);
  absl::Status Complete(const v1::EndOfInput& end);
  // Sends grad_input rows checked finite by grad_input_: into the region, on
  // the data plane, or split to messages.
  void SendGradInput(int64_t token_offset, int64_t rows, std::string data);
  void SendGradInputOnDataPlane(int64_t token_offset, const std::string& data);
  absl::Status GradInputStatus();
  void SendTokenOutputs(const ComputeResult& result);
  void Abandon();

  const ServiceContext& ctx_;
  ComputeChannel* channel_;
  const Principal& who_;
  RpcScope* scope_;
  absl::Time start_;

  v1::ComputeHeader header_;
  HeadEntry head_;
  HeadGate::Use head_use_;  // until the engine call has finished reading the weight
  double gate_wait_ms_ = 0.0;
  ComputeSpec spec_;
  std::string request_id_;
  std::string session_id_;
  bool forward_only_ = false;
  bool deferred_ = false;
  std::shared_ptr<Session> session_;
  bool slot_held_ = false;  // BeginContribution recorded the call in flight
  BeginResult begin_;       // replay or not
  StagedGrad staging_;
  double staging_wait_ms_ = 0.0;
  std::unique_ptr<ComputeCall> call_;
  std::optional<RowTracker> rows_;
  int64_t row_bytes_ = 0;
  uint64_t hidden_fingerprint_ = 0;  // HiddenFingerprint summed over the rows received
  // ...or the engine's fingerprint (kernels/device_fingerprint.h), when they were read on the GPU.
  bool hidden_on_device_ = false;
  std::unique_ptr<GradInputSender> grad_input_;  // when grad_input is asked for
  // The shm and cuda_ipc transports: hidden read from, grad_input written
  // into, the region.
  std::shared_ptr<const MappedRegion> region_;
  int64_t hidden_offset_ = 0;
  int64_t grad_input_offset_ = 0;
  absl::Mutex region_write_mu_;
  absl::Status region_write_status_ ABSL_GUARDED_BY(region_write_mu_);
  // ComputeHeader.data_plane: the token its connection joined with, and the
  // connection once grad_input is first written to it.
  std::string data_plane_token_;
  std::shared_ptr<BulkWriter> data_plane_;
  absl::Status data_plane_status_ ABSL_GUARDED_BY(region_write_mu_);
};

}  // namespace flce::server

#endif  // FLCE_SERVER_HANDLERS_COMPUTE_JOB_H_
