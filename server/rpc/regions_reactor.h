// The Regions RPC: a client on the server's host registers shared-memory
// regions (see SharedRegions) and keeps them while this stream lives. One
// message at a time: each register or release is answered, a renew is not.
// The stream's end, however it comes, releases every region it registered.
#ifndef FLCE_SERVER_RPC_REGIONS_REACTOR_H_
#define FLCE_SERVER_RPC_REGIONS_REACTOR_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "flce/v1/flce.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "server/handlers/service_context.h"

namespace flce::server {

class RegionsReactor : public grpc::ServerBidiReactor<v1::RegionRequest, v1::RegionResponse> {
 public:
  RegionsReactor(const ServiceContext& ctx, grpc::CallbackServerContext* call,
                 const Principal& who, std::unique_ptr<RpcScope> scope);

  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override;
  void OnDone() override;

 private:
  // OK with a response to write, or the status that ends the stream.
  absl::Status Handle(bool* respond);
  void End(const absl::Status& status);
  // flce_region_refusals_total{reason}.
  void CountRefusal(absl::string_view reason);

  const ServiceContext& ctx_;
  std::unique_ptr<RpcScope> scope_;
  uint64_t stream_ = 0;  // 0 = refused before it was opened
  v1::RegionRequest request_;
  v1::RegionResponse response_;
};

}  // namespace flce::server

#endif  // FLCE_SERVER_RPC_REGIONS_REACTOR_H_
