// Client: training the head on the server (CreateOptimizer, GradNorm, Step, checkpoints).
#include "client/cpp/client.h"
#include "client/cpp/grpc_status.h"
#include "client/cpp/request_id.h"

namespace flce {

absl::StatusOr<v1::OptimizerInfo> Client::CreateOptimizer(
    const v1::CreateOptimizerRequest& request) {
  grpc::ClientContext context;
  Prepare(context);
  v1::OptimizerInfo info;
  absl::Status status = FromGrpcStatus(stub_->CreateOptimizer(&context, request, &info));
  if (!status.ok()) return status;
  return info;
}

absl::StatusOr<v1::GradNormResponse> Client::GradNorm(const std::string& head_id,
                                                      const std::string& session_id) {
  grpc::ClientContext context;
  Prepare(context);
  v1::GradNormRequest request;
  request.set_head_id(head_id);
  request.set_session_id(session_id);
  v1::GradNormResponse response;
  absl::Status status = FromGrpcStatus(stub_->GradNorm(&context, request, &response));
  if (!status.ok()) return status;
  return response;
}

absl::StatusOr<v1::StepResponse> Client::Step(v1::StepRequest request) {
  // The server needs an id so that a retry never applies a step twice.
  if (request.request_id().empty()) request.set_request_id(NewRequestId());
  grpc::ClientContext context;
  Prepare(context);
  v1::StepResponse response;
  absl::Status status = FromGrpcStatus(stub_->Step(&context, request, &response));
  if (!status.ok()) return status;
  return response;
}

absl::StatusOr<v1::CheckpointInfo> Client::SaveCheckpoint(v1::SaveCheckpointRequest request) {
  if (request.request_id().empty()) request.set_request_id(NewRequestId());
  grpc::ClientContext context;
  Prepare(context);
  v1::CheckpointInfo info;
  absl::Status status = FromGrpcStatus(stub_->SaveCheckpoint(&context, request, &info));
  if (!status.ok()) return status;
  return info;
}

absl::StatusOr<v1::HeadInfo> Client::LoadCheckpoint(v1::LoadCheckpointRequest request) {
  if (request.request_id().empty()) request.set_request_id(NewRequestId());
  grpc::ClientContext context;
  Prepare(context);
  v1::HeadInfo info;
  absl::Status status = FromGrpcStatus(stub_->LoadCheckpoint(&context, request, &info));
  if (!status.ok()) return status;
  return info;
}

}  // namespace flce
