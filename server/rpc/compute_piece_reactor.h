// The ComputePiece RPC: more of a Compute call's hidden rows on a connection
// of their own. The first message is the token the call answered its header
// with (bound to the call's tenant), then hidden chunks and the piece's end;
// each parsed message goes to the call (PieceTarget), which answers the piece
// once it has taken every row. A piece that breaks off, or sends what it
// should not, fails the whole call; the call's end fails a piece still open.
#ifndef FLCE_SERVER_RPC_COMPUTE_PIECE_REACTOR_H_
#define FLCE_SERVER_RPC_COMPUTE_PIECE_REACTOR_H_

#include <memory>

#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"
#include "server/handlers/service_context.h"

namespace flce::server {

class ComputePieceReactor : public grpc::ServerReadReactor<grpc::ByteBuffer> {
 public:
  ComputePieceReactor(const ServiceContext& ctx, grpc::ByteBuffer* response, Principal who,
                      std::unique_ptr<RpcScope> scope);

  void OnReadDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

 private:
  // What the call's callbacks reach; outlives the reactor (OnDone clears it).
  struct Link;

  void Join(const std::string& token);
  // A refusal before the piece joined (after, the call's answer ends it).
  void End(const absl::Status& status);

  const ServiceContext& ctx_;
  grpc::ByteBuffer* response_;
  const Principal who_;
  std::unique_ptr<RpcScope> scope_;
  grpc::ByteBuffer request_;
  std::shared_ptr<Link> link_;
  std::shared_ptr<PieceTarget> call_;  // set once joined
  int piece_ = 0;
  bool ended_input_ = false;  // its end message was read
};

}  // namespace flce::server

#endif  // FLCE_SERVER_RPC_COMPUTE_PIECE_REACTOR_H_
