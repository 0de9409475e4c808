// flce.v1.Flce on gRPC's callback API. Streaming RPCs have their own reactor
// classes (compute_reactor, upload_reactor, fetch_grad_reactor); unary RPCs
// that touch the engine (file loads, commits, zeroing, deleting) run on the
// worker pool and finish their default reactor from there, those that only
// read the registries answer inline.
#ifndef FLCE_SERVER_RPC_FLCE_SERVICE_H_
#define FLCE_SERVER_RPC_FLCE_SERVICE_H_

#include "flce/v1/flce.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "server/handlers/service_context.h"

namespace flce::server {

// gRPC's CallbackService, but Compute, ComputePiece and EmbedGrad take and give bytes:
// they parse their request messages themselves, because gRPC reports a
// message that does not parse exactly like the client's half-close, which
// after the end message would land the call.
using FlceServiceBase = v1::Flce::WithCallbackMethod_UploadHead<
    v1::Flce::WithCallbackMethod_LoadHeadFromFile<v1::Flce::WithCallbackMethod_DescribeHead<
        v1::Flce::WithCallbackMethod_ListHeads<v1::Flce::WithCallbackMethod_UnloadHead<
            v1::Flce::WithRawCallbackMethod_Compute<v1::Flce::WithRawCallbackMethod_ComputePiece<v1::Flce::WithCallbackMethod_Commit<
                v1::Flce::WithCallbackMethod_FetchGrad<v1::Flce::WithCallbackMethod_ZeroGrad<
                    v1::Flce::WithCallbackMethod_ListSessions<
                        v1::Flce::WithCallbackMethod_DeleteSession<
                            v1::Flce::WithCallbackMethod_GetServerInfo<
                                v1::Flce::WithCallbackMethod_CreateOptimizer<
                                    v1::Flce::WithCallbackMethod_Step<
                                        v1::Flce::WithCallbackMethod_GradNorm<
                                            v1::Flce::WithCallbackMethod_DownloadHead<
                                                v1::Flce::WithCallbackMethod_Embed<
                                                    v1::Flce::WithRawCallbackMethod_EmbedGrad<
                                                        v1::Flce::WithCallbackMethod_SaveCheckpoint<
                                                            v1::Flce::WithCallbackMethod_LoadCheckpoint<
                                                                v1::Flce::WithCallbackMethod_Regions<
                                                                    v1::Flce::Service>>>>>>>>>>>>>>>>>>>>>>;

class FlceService final : public FlceServiceBase {
 public:
  explicit FlceService(const ServiceContext* ctx) : ctx_(*ctx) {}

  grpc::ServerReadReactor<v1::UploadHeadRequest>* UploadHead(grpc::CallbackServerContext* call,
                                                             v1::HeadInfo* response) override;
  grpc::ServerUnaryReactor* LoadHeadFromFile(grpc::CallbackServerContext* call,
                                             const v1::LoadHeadFromFileRequest* request,
                                             v1::HeadInfo* response) override;
  grpc::ServerUnaryReactor* DescribeHead(grpc::CallbackServerContext* call,
                                         const v1::DescribeHeadRequest* request,
                                         v1::HeadInfo* response) override;
  grpc::ServerUnaryReactor* ListHeads(grpc::CallbackServerContext* call,
                                      const v1::ListHeadsRequest* request,
                                      v1::ListHeadsResponse* response) override;
  grpc::ServerUnaryReactor* UnloadHead(grpc::CallbackServerContext* call,
                                       const v1::UnloadHeadRequest* request,
                                       v1::UnloadHeadResponse* response) override;
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* Compute(
      grpc::CallbackServerContext* call) override;
  grpc::ServerReadReactor<grpc::ByteBuffer>* ComputePiece(grpc::CallbackServerContext* call,
                                                          grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Commit(grpc::CallbackServerContext* call,
                                   const v1::CommitRequest* request,
                                   v1::CommitResponse* response) override;
  grpc::ServerWriteReactor<v1::FetchGradResponse>* FetchGrad(
      grpc::CallbackServerContext* call, const v1::FetchGradRequest* request) override;
  grpc::ServerUnaryReactor* ZeroGrad(grpc::CallbackServerContext* call,
                                     const v1::ZeroGradRequest* request,
                                     v1::ZeroGradResponse* response) override;
  grpc::ServerUnaryReactor* ListSessions(grpc::CallbackServerContext* call,
                                         const v1::ListSessionsRequest* request,
                                         v1::ListSessionsResponse* response) override;
  grpc::ServerUnaryReactor* DeleteSession(grpc::CallbackServerContext* call,
                                          const v1::DeleteSessionRequest* request,
                                          v1::DeleteSessionResponse* response) override;
  grpc::ServerUnaryReactor* GetServerInfo(grpc::CallbackServerContext* call,
                                          const v1::ServerInfoRequest* request,
                                          v1::ServerInfo* response) override;
  grpc::ServerUnaryReactor* CreateOptimizer(grpc::CallbackServerContext* call,
                                            const v1::CreateOptimizerRequest* request,
                                            v1::OptimizerInfo* response) override;
  grpc::ServerUnaryReactor* Step(grpc::CallbackServerContext* call, const v1::StepRequest* request,
                                 v1::StepResponse* response) override;
  grpc::ServerWriteReactor<v1::DownloadHeadResponse>* DownloadHead(
      grpc::CallbackServerContext* call, const v1::DownloadHeadRequest* request) override;
  grpc::ServerWriteReactor<v1::EmbedResponse>* Embed(grpc::CallbackServerContext* call,
                                                     const v1::EmbedRequest* request) override;
  grpc::ServerReadReactor<grpc::ByteBuffer>* EmbedGrad(grpc::CallbackServerContext* call,
                                                       grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* SaveCheckpoint(grpc::CallbackServerContext* call,
                                           const v1::SaveCheckpointRequest* request,
                                           v1::CheckpointInfo* response) override;
  grpc::ServerUnaryReactor* LoadCheckpoint(grpc::CallbackServerContext* call,
                                           const v1::LoadCheckpointRequest* request,
                                           v1::HeadInfo* response) override;
  grpc::ServerUnaryReactor* GradNorm(grpc::CallbackServerContext* call,
                                     const v1::GradNormRequest* request,
                                     v1::GradNormResponse* response) override;
  grpc::ServerBidiReactor<v1::RegionRequest, v1::RegionResponse>* Regions(
      grpc::CallbackServerContext* call) override;

 private:
  const ServiceContext& ctx_;
};

}  // namespace flce::server

#endif  // FLCE_SERVER_RPC_FLCE_SERVICE_H_
