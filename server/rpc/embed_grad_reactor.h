// The EmbedGrad RPC: a tied embedding's gradient, added into the session's
// grad_W where the LM head's own gradient accumulates. A client stream
// (header with the token ids, gradient rows, end message) handled one message
// at a time on the worker pool; the rows are kept until the stream closes after
// the end message, then scatter-added into a private staging buffer that lands
// in the session like a Compute call's contribution: nothing lands without the
// end message or with anything after it, a repeated request id is never
// applied twice, rows and sums must be finite.
#ifndef FLCE_SERVER_RPC_EMBED_GRAD_REACTOR_H_
#define FLCE_SERVER_RPC_EMBED_GRAD_REACTOR_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "flce/v1/flce.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "server/handlers/service_context.h"
#include "server/state/head_registry.h"
#include "server/state/session_store.h"
#include "server/validate/validation.h"

namespace flce::server {

// Messages travel as bytes: a request that does not parse fails the call
// (gRPC's own parsing would report it as the half-close that lands the call).
class EmbedGradReactor : public grpc::ServerReadReactor<grpc::ByteBuffer> {
 public:
  // response: where the serialized EmbedGradSummary goes.
  EmbedGradReactor(const ServiceContext& ctx, grpc::CallbackServerContext* call,
                   grpc::ByteBuffer* response, Principal who, std::unique_ptr<RpcScope> scope);

  void OnReadDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

 private:
  absl::Status ParseAndHandle();  // request_
  absl::Status Handle(const v1::EmbedGradRequest& request);
  absl::Status Setup(const v1::EmbedGradHeader& header);
  absl::Status AddRows(const v1::EmbedRows& rows);
  // The end message's count and every row present; the call lands only after
  // the stream closes behind it (Land), so that nothing can follow it.
  absl::Status CheckEnd(const v1::EndOfInput& end);
  absl::Status Land();
  void End(const absl::Status& status);

  const ServiceContext& ctx_;
  grpc::CallbackServerContext* call_;
  grpc::ByteBuffer* response_;
  v1::EmbedGradSummary summary_;
  const Principal who_;
  std::unique_ptr<RpcScope> scope_;
  grpc::ByteBuffer request_;
  std::atomic<bool> cancelled_{false};
  // Touched by one pool task at a time (the next read starts after it).
  bool have_header_ = false;
  bool ended_ = false;
  v1::EmbedGradHeader header_;
  HeadEntry head_;
  DType dtype_ = DType::kF32;
  std::vector<int32_t> ids_;
  std::optional<int32_t> padding_idx_;
  std::string rows_;  // num_tokens x H in dtype_, filled as chunks arrive
  int64_t row_bytes_ = 0;
  std::optional<RowTracker> tracker_;
  uint64_t rows_fingerprint_ = 0;
  std::shared_ptr<Session> session_;
  BeginResult begin_;
  bool slot_held_ = false;
};

}  // namespace flce::server

#endif  // FLCE_SERVER_RPC_EMBED_GRAD_REACTOR_H_
