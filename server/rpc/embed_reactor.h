// The Embed RPC, the lookup of a head tied to its model's input embedding:
// EmbedHeader, then the rows of the request's token ids. Each message is
// gathered on the worker pool just before it is written, while no optimizer
// step rewrites the head, and only while the head's version is the header's:
// a step in between fails the call with ABORTED (retry).
#ifndef FLCE_SERVER_RPC_EMBED_REACTOR_H_
#define FLCE_SERVER_RPC_EMBED_REACTOR_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "flce/v1/flce.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "server/handlers/service_context.h"
#include "server/rpc/pooled_write_reactor.h"
#include "server/state/head_registry.h"

namespace flce::server {

class EmbedReactor : public PooledWriteReactor<v1::EmbedResponse> {
 public:
  EmbedReactor(const ServiceContext& ctx, const v1::EmbedRequest* request, Principal who,
               std::unique_ptr<RpcScope> scope);

 private:
  absl::Status Prepare() override;
  // Fills response() with the next rows; false when every row was sent.
  absl::StatusOr<bool> Next() override;
  void Release() override;

  v1::EmbedRequest request_;
  const Principal who_;
  // Touched by one pool task at a time (the next starts after OnWriteDone).
  HeadEntry head_;
  std::vector<int32_t> ids_;
  DType dtype_ = DType::kF32;
  int64_t chunk_rows_ = 0;
  int64_t next_ = 0;
};

}  // namespace flce::server

#endif  // FLCE_SERVER_RPC_EMBED_REACTOR_H_
