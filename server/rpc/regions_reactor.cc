#include "server/rpc/regions_reactor.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "server/base/status_mapping.h"

namespace flce::server {

RegionsReactor::RegionsReactor(const ServiceContext& ctx, grpc::CallbackServerContext* call,
                               const Principal& who, std::unique_ptr<RpcScope> scope)
    : ctx_(ctx), scope_(std::move(scope)) {
  if (ctx_.regions == nullptr) {
    CountRefusal("no_regions");
    End(absl::FailedPreconditionError(
        "this server takes no regions (its --local-transports is none: start it with "
        "--local-transports=shm, cuda_ipc or auto); send messages"));
    return;
  }
  LocalOffer offer = ctx_.peers->OfferTo(call->peer());
  if (!offer.any()) {
    CountRefusal(offer.refusal_reason);
    End(absl::PermissionDeniedError(offer.refusal));
    return;
  }
  stream_ = ctx_.regions->OpenStream(who.tenant, call, std::move(offer));
  StartRead(&request_);
}

void RegionsReactor::OnReadDone(bool ok) {
  if (!ok) {  // the client closed its side (or went away): its regions go
    End(absl::OkStatus());
    return;
  }
  bool respond = false;
  absl::Status status = Handle(&respond);
  if (!status.ok()) {
    End(status);
  } else if (respond) {
    StartWrite(&response_);
  } else {
    StartRead(&request_);
  }
}

void RegionsReactor::OnWriteDone(bool ok) {
  if (!ok) {
    End(absl::CancelledError("the client went away"));
    return;
  }
  StartRead(&request_);
}

absl::Status RegionsReactor::Handle(bool* respond) {
  ctx_.regions->Renew(stream_);
  response_.Clear();
  switch (request_.msg_case()) {
    case v1::RegionRequest::kRegister: {
      const v1::RegisterRegion& reg = request_.register_();
      absl::StatusOr<std::string> id;
      if (reg.has_cuda_ipc()) {
        if (!reg.name().empty()) {
          CountRefusal("invalid");
          return absl::InvalidArgumentError(
              "RegisterRegion names a shared-memory object and CUDA IPC memory: send one");
        }
        PeerMemoryHandle handle;
        handle.memory_handle = reg.cuda_ipc().memory_handle();
        handle.event_handle = reg.cuda_ipc().event_handle();
        handle.device_uuid = reg.cuda_ipc().device_uuid();
        handle.bytes = reg.bytes();
        handle.key = reg.key();
        id = ctx_.regions->RegisterDevice(stream_, handle);
      } else {
        id = ctx_.regions->Register(stream_, reg.name(), reg.bytes(), reg.key());
      }
      if (!id.ok()) {
        CountRefusal(SharedRegions::RefusalReason(id.status()));
        return id.status();
      }
      response_.set_region_id(*id);
      response_.set_bytes(reg.bytes());
      response_.set_lease_s(absl::ToDoubleSeconds(ctx_.regions->lease()));
      *respond = true;
      return absl::OkStatus();
    }
    case v1::RegionRequest::kRelease: {
      const std::string& id = request_.release().region_id();
      if (absl::Status s = ctx_.regions->Release(stream_, id); !s.ok()) return s;
      response_.set_region_id(id);
      response_.set_released(true);
      *respond = true;
      return absl::OkStatus();
    }
    case v1::RegionRequest::kRenew:
      return absl::OkStatus();
    default:
      return absl::InvalidArgumentError("a RegionRequest holds none of register, release, renew");
  }
}

void RegionsReactor::CountRefusal(absl::string_view reason) {
  if (ctx_.metrics != nullptr) ctx_.metrics->RecordRegionRefusal(reason);
}

void RegionsReactor::End(const absl::Status& status) {
  if (stream_ != 0) ctx_.regions->CloseStream(stream_);
  grpc::Status grpc_status = ToGrpcStatus(status);
  scope_->Done(grpc_status);
  Finish(grpc_status);
}

void RegionsReactor::OnDone() {
  if (stream_ != 0) ctx_.regions->CloseStream(stream_);
  delete this;
}

}  // namespace flce::server
