// The DownloadHead RPC: DownloadHeader, then weight rows, then bias pieces, in
// the head's dtype or as the fp32 master. Each message is copied out of the
// engine on the worker pool just before it is written, under the head's
// training lock (which every optimizer step holds), and only while the head's
// version is the header's: a step in between fails the download with ABORTED.
#ifndef FLCE_SERVER_RPC_DOWNLOAD_HEAD_REACTOR_H_
#define FLCE_SERVER_RPC_DOWNLOAD_HEAD_REACTOR_H_

#include <atomic>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "flce/v1/flce.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "server/handlers/service_context.h"
#include "server/rpc/pooled_write_reactor.h"
#include "server/state/head_registry.h"

namespace flce::server {

class DownloadHeadReactor : public PooledWriteReactor<v1::DownloadHeadResponse> {
 public:
  DownloadHeadReactor(const ServiceContext& ctx, const v1::DownloadHeadRequest* request,
                      Principal who, std::unique_ptr<RpcScope> scope);

 private:
  absl::Status Prepare() override;
  // Fills response() with the next chunk; false when everything was sent.
  absl::StatusOr<bool> Next() override;
  // Elements [begin, begin + count) of the weight or bias into out.
  absl::Status CopyElements(HeadTensor tensor, int64_t begin, int64_t count, char* out);
  void Release() override;

  v1::DownloadHeadRequest request_;
  const Principal who_;
  // Touched by one pool task at a time (the next starts after OnWriteDone).
  HeadEntry head_;
  DType dtype_ = DType::kF32;
  int64_t chunk_rows_ = 0;
  int64_t bias_chunk_ = 0;
  int64_t next_row_ = 0;
  int64_t next_bias_ = 0;
};

}  // namespace flce::server

#endif  // FLCE_SERVER_RPC_DOWNLOAD_HEAD_REACTOR_H_
