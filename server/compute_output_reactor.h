// The ComputeOutput RPC: the output half of a Compute call whose header names
// an output_token (server/output_streams.h). It writes what the Compute call
// sends into their OutputStream and ends when that call is over.
#ifndef FLCE_SERVER_COMPUTE_OUTPUT_REACTOR_H_
#define FLCE_SERVER_COMPUTE_OUTPUT_REACTOR_H_

#include <memory>

#include "flce/v1/flce.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "server/output_streams.h"
#include "server/service_context.h"

namespace flce::server {

class ComputeOutputReactor : public grpc::ServerWriteReactor<v1::ComputeResponse>,
                             public OutputWriter {
 public:
  ComputeOutputReactor(const ServiceContext& ctx, const v1::ComputeOutputRequest& request,
                       const Principal& who, std::unique_ptr<RpcScope> scope);

  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

  // OutputWriter
  void Write(const v1::ComputeResponse* response) override;
  void End(const grpc::Status& status) override;

 private:
  const ServiceContext& ctx_;
  std::unique_ptr<RpcScope> scope_;
  std::shared_ptr<OutputStream> stream_;  // null when refused at the start
};

}  // namespace flce::server

#endif  // FLCE_SERVER_COMPUTE_OUTPUT_REACTOR_H_
