// The Compute RPC: a bidirectional stream (header, hidden chunks in; grad_input
// chunks, token outputs and a summary out).
//
// State machine of one call:
//   reactor thread            worker thread (one per call)
//   OnReadDone -> queue  -->  header: validate, head snapshot, session slot,
//   (next StartRead only       staging GradBuffer, engine StartCompute
//    while the queue has      chunk: check rows / overlap / NaN, AddHidden
//    room: backpressure)      end of input: Finish, commit, outputs, summary
//   OnWriteDone <- out queue <-- engine sink (grad_input rows, split to fit
//                                --max-message-mb)
// The reactions never wait on the engine. Finish is sent only when no write is
// in flight and no Start* call is being made, so the reactor is never used
// after OnDone. Any failure or cancellation destroys the engine call and drops
// the staged contribution: the session's grad_W changes only on success.
#ifndef FLCE_SERVER_RPC_COMPUTE_REACTOR_H_
#define FLCE_SERVER_RPC_COMPUTE_REACTOR_H_

#include <memory>

#include "flce/v1/flce.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "server/handlers/service_context.h"

namespace flce::server {

class ComputeStream;

// Messages travel as bytes: the stream parses requests itself (a message
// that does not parse fails the call, where gRPC would report a half-close)
// and serializes each response where its write starts, as gRPC would.
class ComputeReactor : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  ComputeReactor(const ServiceContext& ctx, grpc::CallbackServerContext* call, Principal who,
                 std::unique_ptr<RpcScope> scope);

  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

 private:
  std::shared_ptr<ComputeStream> stream_;
};

}  // namespace flce::server

#endif  // FLCE_SERVER_RPC_COMPUTE_REACTOR_H_
