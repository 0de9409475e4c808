#include "server/rpc/flce_service.h"

#include <cmath>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "server/base/status_mapping.h"
#include "server/handlers/head_checkpoint.h"
#include "server/handlers/head_info.h"
#include "server/handlers/optimizer_handlers.h"
#include "server/observe/metrics.h"
#include "server/rpc/compute_piece_reactor.h"
#include "server/rpc/compute_reactor.h"
#include "server/rpc/download_head_reactor.h"
#include "server/rpc/embed_grad_reactor.h"
#include "server/rpc/embed_reactor.h"
#include "server/rpc/fetch_grad_reactor.h"
#include "server/rpc/regions_reactor.h"
#include "server/rpc/upload_reactor.h"
#include "server/state/head_registry.h"
#include "server/storage/head_loader.h"
#include "server/validate/session_id.h"
#include "server/validate/validation.h"

namespace flce::server {
namespace {

// As the server bound it (relative to its working directory, which it never
// changes), for a client whose working directory is elsewhere.
std::string AbsolutePath(const std::string& path) {
  std::error_code error;
  std::filesystem::path absolute = std::filesystem::absolute(path, error);
  return error ? path : absolute.string();
}

// Names of files and tensors: generous, but a request cannot make the server
// keep or log megabytes of them.
constexpr int64_t kMaxPathBytes = 4096;
constexpr int64_t kMaxTensorNameBytes = 1024;

using UnaryWork = std::function<absl::Status(const Principal& who, RpcScope& scope)>;

// Runs `work` for a unary RPC, inline or on the pool, once the caller is
// admitted, and finishes the call with its status, counted and logged.
grpc::ServerUnaryReactor* RunUnary(const ServiceContext& ctx, grpc::CallbackServerContext* call,
                                   const char* rpc, bool on_pool, UnaryWork work) {
  grpc::ServerUnaryReactor* reactor = call->DefaultReactor();
  auto scope = std::make_shared<RpcScope>(ctx, rpc);
  absl::StatusOr<Principal> who = Admit(ctx, *call, *scope);
  auto finish = [reactor, scope](const grpc::Status& status) {
    scope->Done(status);
    reactor->Finish(status);
  };
  if (!who.ok()) {
    finish(ToGrpcStatus(who.status()));
    return reactor;
  }
  auto run = [&ctx, finish, scope, who = *std::move(who), work = std::move(work)] {
    finish(ToGrpcStatus(EngineStatus(*ctx.engine, work(who, *scope))));
  };
  if (on_pool) {
    ctx.pool->Schedule(std::move(run));
  } else {
    run();
  }
  return reactor;
}

// A streaming call refused at the gate: finishes at once with the status.
template <typename Reactor>
class RefusedReactor : public Reactor {
 public:
  RefusedReactor(std::unique_ptr<RpcScope> scope, const grpc::Status& status) {
    scope->Done(status);
    this->Finish(status);
  }
  void OnDone() override { delete this; }
};

}  // namespace

grpc::ServerReadReactor<v1::UploadHeadRequest>* FlceService::UploadHead(
    grpc::CallbackServerContext* call, v1::HeadInfo* response) {
  auto scope = std::make_unique<RpcScope>(ctx_, "UploadHead");
  absl::StatusOr<Principal> who = Admit(ctx_, *call, *scope);
  if (!who.ok()) {
    return new RefusedReactor<grpc::ServerReadReactor<v1::UploadHeadRequest>>(
        std::move(scope), ToGrpcStatus(who.status()));
  }
  return new UploadHeadReactor(ctx_, call, response, *who, std::move(scope));
}

grpc::ServerUnaryReactor* FlceService::LoadHeadFromFile(grpc::CallbackServerContext* call,
                                                        const v1::LoadHeadFromFileRequest* request,
                                                        v1::HeadInfo* response) {
  return RunUnary(
      ctx_, call, "LoadHeadFromFile", true,
      [this, request, response](const Principal& who, RpcScope& scope) {
        scope.set_head(request->head_id());
        FLCE_RETURN_IF_ERROR(ValidateId(request->head_id(), "head_id"));
        FLCE_RETURN_IF_ERROR(ValidateText(request->path(), "path", kMaxPathBytes));
        FLCE_RETURN_IF_ERROR(
            ValidateText(request->weight_tensor(), "weight_tensor", kMaxTensorNameBytes));
        FLCE_RETURN_IF_ERROR(
            ValidateText(request->bias_tensor(), "bias_tensor", kMaxTensorNameBytes));
        FLCE_ASSIGN_OR_RETURN(std::string owner,
                              ctx_.heads->WriteOwner(who.tenant, who.admin, request->head_id()));
        FLCE_ASSIGN_OR_RETURN(std::string path,
                              ResolveUnderRoot(ctx_.config.head_root, request->path()));
        std::optional<DType> dtype;
        if (request->dtype() != v1::DTYPE_UNSPECIFIED) {
          FLCE_ASSIGN_OR_RETURN(dtype, DTypeFromProto(request->dtype(), "dtype"));
        }
        // Held until the head is in the registry (or refused), like an upload's.
        UploadBudget::Reservation reservation;
        auto check = [&](const HeadSpec& spec) -> absl::Status {
          FLCE_RETURN_IF_ERROR(ctx_.heads->CheckPut(owner, request->head_id(), spec,
                                                    ResetOptimizer(request->reset_optimizer())));
          FLCE_ASSIGN_OR_RETURN(reservation,
                                ctx_.uploads->Reserve(request->head_id(), HeadBytes(spec)));
          return absl::OkStatus();
        };
        FLCE_ASSIGN_OR_RETURN(std::shared_ptr<const Head> head,
                              LoadSafetensorsHead(*ctx_.engine, path, request->weight_tensor(),
                                                  request->bias_tensor(), dtype, check));
        FLCE_ASSIGN_OR_RETURN(HeadEntry entry,
                              ctx_.heads->Put(owner, request->head_id(), std::move(head),
                                              absl::StrCat("file:", request->path()),
                                              ResetOptimizer(request->reset_optimizer())));
        FillHeadInfo(entry, ctx_.sessions->Count(who.tenant, entry.head_id), response);
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* FlceService::DescribeHead(grpc::CallbackServerContext* call,
                                                    const v1::DescribeHeadRequest* request,
                                                    v1::HeadInfo* response) {
  return RunUnary(ctx_, call, "DescribeHead", false,
                  [this, request, response](const Principal& who, RpcScope& scope) {
                    scope.set_head(request->head_id());
                    FLCE_RETURN_IF_ERROR(ValidateId(request->head_id(), "head_id"));
                    FLCE_ASSIGN_OR_RETURN(HeadEntry entry,
                                          ctx_.heads->Get(who.tenant, request->head_id()));
                    FillHeadInfo(entry, ctx_.sessions->Count(who.tenant, entry.head_id), response);
                    return absl::OkStatus();
                  });
}

grpc::ServerUnaryReactor* FlceService::ListHeads(grpc::CallbackServerContext* call,
                                                 const v1::ListHeadsRequest* request,
                                                 v1::ListHeadsResponse* response) {
  return RunUnary(ctx_, call, "ListHeads", false,
                  [this, response](const Principal& who, RpcScope&) {
                    for (const HeadEntry& entry : ctx_.heads->List(who.tenant)) {
                      FillHeadInfo(entry, ctx_.sessions->Count(who.tenant, entry.head_id),
                                   response->add_heads());
                    }
                    return absl::OkStatus();
                  });
}

grpc::ServerUnaryReactor* FlceService::UnloadHead(grpc::CallbackServerContext* call,
                                                  const v1::UnloadHeadRequest* request,
                                                  v1::UnloadHeadResponse* response) {
  return RunUnary(
      ctx_, call, "UnloadHead", true,
      [this, request, response](const Principal& who, RpcScope& scope) {
        scope.set_head(request->head_id());
        FLCE_RETURN_IF_ERROR(ValidateId(request->head_id(), "head_id"));
        // Not found for a head the caller cannot see, denied for a shared head it may not unload.
        FLCE_RETURN_IF_ERROR(ctx_.heads->Get(who.tenant, request->head_id()).status());
        FLCE_ASSIGN_OR_RETURN(std::string owner,
                              ctx_.heads->WriteOwner(who.tenant, who.admin, request->head_id()));
        FLCE_ASSIGN_OR_RETURN(HeadEntry entry, ctx_.heads->Remove(owner, request->head_id()));
        int64_t dropped = ctx_.sessions->DeleteHead(entry.owner, entry.head_id);
        // A shared head's series go now; the tenants' aggregate stays while
        // any tenant head is left (the housekeeping sweep drops it after).
        if (ctx_.metrics != nullptr && entry.owner.empty()) {
          ctx_.metrics->ForgetHead(Metrics::HeadLabel(entry.owner, entry.head_id));
        }
        FillHeadInfo(entry, dropped, response->mutable_head());
        response->set_sessions_dropped(dropped);
        return absl::OkStatus();
      });
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* FlceService::Compute(
    grpc::CallbackServerContext* call) {
  auto scope = std::make_unique<RpcScope>(ctx_, "Compute");
  absl::StatusOr<Principal> who = Admit(ctx_, *call, *scope);
  if (!who.ok()) {
    return new RefusedReactor<grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>>(
        std::move(scope), ToGrpcStatus(who.status()));
  }
  return new ComputeReactor(ctx_, call, *who, std::move(scope));
}

grpc::ServerUnaryReactor* FlceService::Commit(grpc::CallbackServerContext* call,
                                              const v1::CommitRequest* request,
                                              v1::CommitResponse* response) {
  return RunUnary(
      ctx_, call, "Commit", true, [this, request, response](const Principal& who, RpcScope& scope) {
        const std::string session_id = SessionIdOrDefault(request->session_id());
        scope.set_request_id(request->request_id());
        scope.set_head(request->head_id());
        scope.set_session(session_id);
        FLCE_RETURN_IF_ERROR(ValidateId(request->head_id(), "head_id"));
        FLCE_RETURN_IF_ERROR(ValidateId(session_id, "session_id"));
        FLCE_RETURN_IF_ERROR(ValidateId(request->request_id(), "request_id"));
        // Unset is 1, not proto3's 0: a client that leaves it out must not
        // commit its contribution times zero.
        const float scale = request->has_scale() ? request->scale() : 1.0f;
        if (!std::isfinite(scale)) {
          return absl::InvalidArgumentError(absl::StrCat("scale = ", scale, " is not finite"));
        }
        FLCE_ASSIGN_OR_RETURN(
            CommitResult result,
            ctx_.sessions->Commit(who.tenant, request->head_id(), session_id, request->request_id(),
                                  scale, request->discard()));
        response->set_state(ToProto(result.state));
        response->set_replayed(result.replayed);
        response->set_scale(result.scale);
        return absl::OkStatus();
      });
}

grpc::ServerWriteReactor<v1::FetchGradResponse>* FlceService::FetchGrad(
    grpc::CallbackServerContext* call, const v1::FetchGradRequest* request) {
  auto scope = std::make_unique<RpcScope>(ctx_, "FetchGrad");
  absl::StatusOr<Principal> who = Admit(ctx_, *call, *scope);
  if (!who.ok()) {
    return new RefusedReactor<grpc::ServerWriteReactor<v1::FetchGradResponse>>(
        std::move(scope), ToGrpcStatus(who.status()));
  }
  return new FetchGradReactor(ctx_, request, *who, std::move(scope));
}

grpc::ServerWriteReactor<v1::DownloadHeadResponse>* FlceService::DownloadHead(
    grpc::CallbackServerContext* call, const v1::DownloadHeadRequest* request) {
  auto scope = std::make_unique<RpcScope>(ctx_, "DownloadHead");
  absl::StatusOr<Principal> who = Admit(ctx_, *call, *scope);
  if (!who.ok()) {
    return new RefusedReactor<grpc::ServerWriteReactor<v1::DownloadHeadResponse>>(
        std::move(scope), ToGrpcStatus(who.status()));
  }
  return new DownloadHeadReactor(ctx_, request, *who, std::move(scope));
}

grpc::ServerUnaryReactor* FlceService::ZeroGrad(grpc::CallbackServerContext* call,
                                                const v1::ZeroGradRequest* request,
                                                v1::ZeroGradResponse* response) {
  return RunUnary(
      ctx_, call, "ZeroGrad", true, [this, request](const Principal& who, RpcScope& scope) {
        const std::string session_id = SessionIdOrDefault(request->session_id());
        scope.set_head(request->head_id());
        scope.set_session(session_id);
        FLCE_RETURN_IF_ERROR(ctx_.heads->Get(who.tenant, request->head_id()).status());
        absl::Status zeroed = ctx_.sessions->Zero(who.tenant, request->head_id(), session_id);
        // A session that does not exist yet already has a zero gradient: a
        // training loop's first zero_grad() succeeds without allocating one.
        return absl::IsNotFound(zeroed) ? absl::OkStatus() : zeroed;
      });
}

grpc::ServerUnaryReactor* FlceService::ListSessions(grpc::CallbackServerContext* call,
                                                    const v1::ListSessionsRequest* request,
                                                    v1::ListSessionsResponse* response) {
  return RunUnary(
      ctx_, call, "ListSessions", false,
      [this, request, response](const Principal& who, RpcScope& scope) {
        scope.set_head(request->head_id());
        for (const SessionSummary& s : ctx_.sessions->List(who.tenant, request->head_id())) {
          FillSessionInfo(s, response->add_sessions());
        }
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* FlceService::DeleteSession(grpc::CallbackServerContext* call,
                                                     const v1::DeleteSessionRequest* request,
                                                     v1::DeleteSessionResponse* response) {
  return RunUnary(ctx_, call, "DeleteSession", true,
                  [this, request](const Principal& who, RpcScope& scope) {
                    const std::string session_id = SessionIdOrDefault(request->session_id());
                    scope.set_head(request->head_id());
                    scope.set_session(session_id);
                    return ctx_.sessions->Delete(who.tenant, request->head_id(), session_id);
                  });
}

grpc::ServerUnaryReactor* FlceService::GetServerInfo(grpc::CallbackServerContext* call,
                                                     const v1::ServerInfoRequest* request,
                                                     v1::ServerInfo* response) {
  return RunUnary(ctx_, call, "GetServerInfo", false,
                  [this, call, response](const Principal&, RpcScope&) {
                    EngineInfo info = ctx_.engine->info();
                    response->set_instance_id(ctx_.instance_id);
                    response->set_version(ctx_.version);
                    response->set_engine(info.name);
                    response->set_workspace_budget_bytes(info.workspace_budget_bytes);
                    response->set_max_request_tokens(ctx_.config.max_request_tokens);
                    response->set_max_message_bytes(ctx_.config.max_message_bytes);
                    response->add_capabilities("optimizer");
                    response->add_capabilities("embed");
                    response->add_capabilities("targets_in_region");
                    response->add_capabilities("hidden_pieces");
                    if (ctx_.data_plane_port != 0) {
                      response->add_capabilities("data_plane");
                      response->set_data_plane_port(ctx_.data_plane_port);
                    }
                    if (info.policy_objectives) response->add_capabilities("policy_objectives");
                    // Two passes over any engine's calls (StartComputeCall).
                    response->add_capabilities("preference_objectives");
                    if (!ctx_.config.checkpoint_dir.empty()) {
                      response->add_capabilities("checkpoint");
                    }
                    response->set_boot_id(HostBootId());
                    response->set_device_uuid(info.device_uuid);
                    const bool local = IsLocalPeer(call->peer());
                    if (local && !ctx_.config.unix_socket.empty()) {
                      response->set_unix_socket(AbsolutePath(ctx_.config.unix_socket));
                    }
                    // What this caller may register, which depends on who it is.
                    const LocalOffer offer = ctx_.peers->OfferTo(call->peer());
                    if (ctx_.regions != nullptr && offer.shm) {
                      response->add_local_transports("shm");
                    }
                    if (ctx_.regions != nullptr && offer.cuda_ipc) {
                      response->add_local_transports("cuda_ipc");
                    }
                    return absl::OkStatus();
                  });
}

grpc::ServerUnaryReactor* FlceService::CreateOptimizer(grpc::CallbackServerContext* call,
                                                       const v1::CreateOptimizerRequest* request,
                                                       v1::OptimizerInfo* response) {
  return RunUnary(ctx_, call, "CreateOptimizer", true,
                  [this, request, response](const Principal& who, RpcScope& scope) {
                    scope.set_head(request->head_id());
                    return CreateHeadOptimizer(ctx_, who, *request, response);
                  });
}

grpc::ServerUnaryReactor* FlceService::Step(grpc::CallbackServerContext* call,
                                            const v1::StepRequest* request,
                                            v1::StepResponse* response) {
  return RunUnary(
      ctx_, call, "Step", true,
      [this, call, request, response](const Principal& who, RpcScope& scope) {
        scope.set_request_id(request->request_id());
        scope.set_head(request->head_id());
        scope.set_session(SessionIdOrDefault(request->session_id()));
        auto alive = [call]() {
          return call->IsCancelled() ? absl::CancelledError("the Step call was cancelled")
                                     : absl::OkStatus();
        };
        return StepHead(ctx_, who, *request, absl::FromChrono(call->deadline()), alive, response);
      });
}

grpc::ServerWriteReactor<v1::EmbedResponse>* FlceService::Embed(grpc::CallbackServerContext* call,
                                                                const v1::EmbedRequest* request) {
  auto scope = std::make_unique<RpcScope>(ctx_, "Embed");
  absl::StatusOr<Principal> who = Admit(ctx_, *call, *scope);
  if (!who.ok()) {
    return new RefusedReactor<grpc::ServerWriteReactor<v1::EmbedResponse>>(
        std::move(scope), ToGrpcStatus(who.status()));
  }
  return new EmbedReactor(ctx_, request, *who, std::move(scope));
}

grpc::ServerReadReactor<grpc::ByteBuffer>* FlceService::ComputePiece(
    grpc::CallbackServerContext* call, grpc::ByteBuffer* response) {
  auto scope = std::make_unique<RpcScope>(ctx_, "ComputePiece");
  absl::StatusOr<Principal> who = Admit(ctx_, *call, *scope);
  if (!who.ok()) {
    return new RefusedReactor<grpc::ServerReadReactor<grpc::ByteBuffer>>(
        std::move(scope), ToGrpcStatus(who.status()));
  }
  return new ComputePieceReactor(ctx_, response, *who, std::move(scope));
}

grpc::ServerReadReactor<grpc::ByteBuffer>* FlceService::EmbedGrad(
    grpc::CallbackServerContext* call, grpc::ByteBuffer* response) {
  auto scope = std::make_unique<RpcScope>(ctx_, "EmbedGrad");
  absl::StatusOr<Principal> who = Admit(ctx_, *call, *scope);
  if (!who.ok()) {
    return new RefusedReactor<grpc::ServerReadReactor<grpc::ByteBuffer>>(
        std::move(scope), ToGrpcStatus(who.status()));
  }
  return new EmbedGradReactor(ctx_, call, response, *who, std::move(scope));
}

grpc::ServerBidiReactor<v1::RegionRequest, v1::RegionResponse>* FlceService::Regions(
    grpc::CallbackServerContext* call) {
  auto scope = std::make_unique<RpcScope>(ctx_, "Regions");
  absl::StatusOr<Principal> who = Admit(ctx_, *call, *scope);
  if (!who.ok()) {
    return new RefusedReactor<grpc::ServerBidiReactor<v1::RegionRequest, v1::RegionResponse>>(
        std::move(scope), ToGrpcStatus(who.status()));
  }
  return new RegionsReactor(ctx_, call, *who, std::move(scope));
}

grpc::ServerUnaryReactor* FlceService::SaveCheckpoint(grpc::CallbackServerContext* call,
                                                      const v1::SaveCheckpointRequest* request,
                                                      v1::CheckpointInfo* response) {
  return RunUnary(ctx_, call, "SaveCheckpoint", true,
                  [this, request, response](const Principal& who, RpcScope& scope) {
                    scope.set_request_id(request->request_id());
                    scope.set_head(request->head_id());
                    return SaveHeadCheckpoint(ctx_, who, *request, response);
                  });
}

grpc::ServerUnaryReactor* FlceService::LoadCheckpoint(grpc::CallbackServerContext* call,
                                                      const v1::LoadCheckpointRequest* request,
                                                      v1::HeadInfo* response) {
  return RunUnary(ctx_, call, "LoadCheckpoint", true,
                  [this, request, response](const Principal& who, RpcScope& scope) {
                    scope.set_request_id(request->request_id());
                    scope.set_head(request->head_id());
                    return LoadHeadCheckpoint(ctx_, who, *request, response);
                  });
}

grpc::ServerUnaryReactor* FlceService::GradNorm(grpc::CallbackServerContext* call,
                                                const v1::GradNormRequest* request,
                                                v1::GradNormResponse* response) {
  return RunUnary(ctx_, call, "GradNorm", true,
                  [this, request, response](const Principal& who, RpcScope& scope) {
                    scope.set_head(request->head_id());
                    scope.set_session(SessionIdOrDefault(request->session_id()));
                    return HeadGradNorm(ctx_, who, *request, response);
                  });
}

}  // namespace flce::server
