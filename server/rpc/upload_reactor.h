// The UploadHead RPC: a client stream (header, then weight and bias chunks in
// order) built straight into the engine through a HeadBuilder. One message is
// handled at a time on the worker pool, and the next read starts only after
// it: an upload never holds more than one chunk in server memory.
#ifndef FLCE_SERVER_RPC_UPLOAD_REACTOR_H_
#define FLCE_SERVER_RPC_UPLOAD_REACTOR_H_

#include <atomic>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "flce/v1/flce.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "kernels/engine.h"
#include "server/handlers/service_context.h"
#include "server/state/upload_budget.h"

namespace flce::server {

class UploadHeadReactor : public grpc::ServerReadReactor<v1::UploadHeadRequest> {
 public:
  UploadHeadReactor(const ServiceContext& ctx, grpc::CallbackServerContext* call,
                    v1::HeadInfo* response, Principal who, std::unique_ptr<RpcScope> scope);

  void OnReadDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

 private:
  absl::Status Handle(const v1::UploadHeadRequest& request);
  absl::Status Complete();
  void End(const absl::Status& status);

  const ServiceContext& ctx_;
  grpc::CallbackServerContext* call_;
  v1::HeadInfo* response_;
  const Principal who_;
  std::unique_ptr<RpcScope> scope_;
  v1::UploadHeadRequest request_;
  std::atomic<bool> cancelled_{false};
  // Touched by one pool task at a time (the next read starts after it).
  bool have_header_ = false;
  bool reset_optimizer_ = false;
  std::string head_id_;
  std::string owner_;  // registry owner the head goes to
  HeadSpec spec_;
  std::unique_ptr<HeadBuilder> builder_;
  UploadBudget::Reservation reservation_;  // held while builder_ is
  int64_t weight_received_ = 0;
  int64_t bias_received_ = 0;
};

}  // namespace flce::server

#endif  // FLCE_SERVER_RPC_UPLOAD_REACTOR_H_
