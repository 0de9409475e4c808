// The FetchGrad RPC: GradHeader, then grad_W rows, then grad_b, from a private
// snapshot of the session's accumulator (or, with reset, the accumulator
// itself, swapped for a zeroed one). Each message is copied out of the engine
// on the worker pool just before it is written: one message in memory at a
// time, whatever the head's size.
#ifndef FLCE_SERVER_RPC_FETCH_GRAD_REACTOR_H_
#define FLCE_SERVER_RPC_FETCH_GRAD_REACTOR_H_

#include <atomic>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "flce/v1/flce.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "server/handlers/service_context.h"
#include "server/rpc/pooled_write_reactor.h"
#include "server/state/session_store.h"

namespace flce::server {

class FetchGradReactor : public PooledWriteReactor<v1::FetchGradResponse> {
 public:
  FetchGradReactor(const ServiceContext& ctx, const v1::FetchGradRequest* request, Principal who,
                   std::unique_ptr<RpcScope> scope);

 private:
  absl::Status Prepare() override;
  // Fills response() with the next chunk; false when everything was sent.
  absl::StatusOr<bool> Next() override;
  void Release() override;

  v1::FetchGradRequest request_;
  const Principal who_;
  // Touched by one pool task at a time (the next starts after OnWriteDone).
  GradSnapshot snapshot_;
  DType dtype_ = DType::kF32;
  int64_t chunk_rows_ = 0;
  int64_t bias_chunk_ = 0;
  int64_t next_row_ = 0;
  int64_t next_bias_ = 0;
};

}  // namespace flce::server

#endif  // FLCE_SERVER_RPC_FETCH_GRAD_REACTOR_H_
