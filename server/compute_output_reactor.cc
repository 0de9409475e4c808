#include "server/compute_output_reactor.h"

#include <utility>

#include "absl/strings/str_cat.h"

#include "server/status_mapping.h"

namespace flce::server {

ComputeOutputReactor::ComputeOutputReactor(const ServiceContext& ctx,
                                           const v1::ComputeOutputRequest& request,
                                           const Principal& who, std::unique_ptr<RpcScope> scope)
    : ctx_(ctx), scope_(std::move(scope)) {
  scope_->set_tenant(who.tenant);
  if (!request.server_instance_id().empty() && request.server_instance_id() != ctx_.instance_id) {
    End(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                     absl::StrCat("ComputeOutputRequest.server_instance_id is \"",
                                  request.server_instance_id(), "\" but this is server instance \"",
                                  ctx_.instance_id,
                                  "\": this connection reached another server than the Compute "
                                  "call's (a load balancer?); get grad_input on the Compute call")));
    return;
  }
  absl::StatusOr<std::shared_ptr<OutputStream>> stream =
      ctx_.outputs->Attach(who.tenant, request.output_token(), this);
  if (!stream.ok()) {
    End(ToGrpcStatus(stream.status()));
    return;
  }
  stream_ = *std::move(stream);
  // Only now: a write started here may complete on another thread at once.
  stream_->Start();
}

void ComputeOutputReactor::Write(const v1::ComputeResponse* response) {
  StartWrite(response);
}

void ComputeOutputReactor::End(const grpc::Status& status) {
  scope_->Done(status);
  Finish(status);
}

void ComputeOutputReactor::OnWriteDone(bool ok) {
  if (stream_ != nullptr) stream_->OnWriteDone(ok);
}

void ComputeOutputReactor::OnCancel() {
  if (stream_ == nullptr) return;
  ctx_.outputs->Forget(*stream_);
  stream_->OnCancel();  // may end the call: nothing of this object is used after it
}

void ComputeOutputReactor::OnDone() { delete this; }

}  // namespace flce::server
