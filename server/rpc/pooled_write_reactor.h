// The shape every server-streaming RPC of flce shares (FetchGrad,
// DownloadHead, Embed): each message is made on the worker pool just before
// it is written (the first when the call starts, each next one once the
// previous was written), so one message is in memory at a time whatever the
// total size, and engine copies never run on gRPC's threads.
//
// Usage (a subclass):
//   MyReactor(...) : PooledWriteReactor(ctx, std::move(scope), "MyRpc") { ...; Start(); }
//   absl::Status Prepare() override;       // fills response() with the first message
//   absl::StatusOr<bool> Next() override;  // fills the next one; false when done
#ifndef FLCE_SERVER_RPC_POOLED_WRITE_REACTOR_H_
#define FLCE_SERVER_RPC_POOLED_WRITE_REACTOR_H_

#include <atomic>
#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/grpcpp.h"
#include "server/base/status_mapping.h"
#include "server/base/worker_pool.h"
#include "server/handlers/service_context.h"

namespace flce::server {

template <typename Response>
class PooledWriteReactor : public grpc::ServerWriteReactor<Response> {
 public:
  void OnWriteDone(bool ok) override {
    if (!ok) {
      End(absl::CancelledError(absl::StrCat("the client went away during ", rpc_)));
      return;
    }
    ctx_.pool->Schedule([this] { Advance(/*first=*/false); });
  }
  void OnCancel() override { cancelled_.store(true); }
  void OnDone() override { delete this; }

 protected:
  PooledWriteReactor(const ServiceContext& ctx, std::unique_ptr<RpcScope> scope, const char* rpc)
      : ctx_(ctx), scope_(std::move(scope)), rpc_(rpc) {}

  // The last thing a subclass's constructor does: from here on the pool may
  // call Prepare() at any moment.
  void Start() {
    ctx_.pool->Schedule([this] { Advance(/*first=*/true); });
  }

  virtual absl::Status Prepare() = 0;
  virtual absl::StatusOr<bool> Next() = 0;
  // Drops what the call holds (a snapshot, a head) before it finishes.
  virtual void Release() {}

  Response& response() { return response_; }
  bool cancelled() const { return cancelled_.load(); }
  RpcScope& scope() { return *scope_; }

  const ServiceContext& ctx_;

 private:
  void Advance(bool first) {
    if (cancelled_.load()) {
      End(absl::CancelledError(absl::StrCat("the client cancelled ", rpc_)));
      return;
    }
    if (first) {
      absl::Status prepared = Prepare();
      if (!prepared.ok()) {
        End(prepared);
        return;
      }
      this->StartWrite(&response_);
      return;
    }
    absl::StatusOr<bool> more = Next();
    if (!more.ok()) {
      End(more.status());
    } else if (!*more) {
      End(absl::OkStatus());
    } else {
      this->StartWrite(&response_);
    }
  }

  void End(const absl::Status& status) {
    Release();
    grpc::Status grpc_status = ToGrpcStatus(EngineStatus(*ctx_.engine, status));
    scope_->Done(grpc_status);
    this->Finish(grpc_status);
  }

  std::unique_ptr<RpcScope> scope_;
  const char* rpc_;
  std::atomic<bool> cancelled_{false};
  // Touched by one pool task at a time (the next starts after OnWriteDone).
  Response response_;
};

}  // namespace flce::server

#endif  // FLCE_SERVER_RPC_POOLED_WRITE_REACTOR_H_
