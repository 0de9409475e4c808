// Regions registered by clients on the server's host: POSIX shared-memory
// objects named "flce-" + 32 hex digits (the "shm" local transport), or
// device memory on the engine's GPU exported with CUDA IPC ("cuda_ipc"),
// held here while their registration stream lives and its lease is renewed. A Compute call holds its region's mapping (a shared_ptr) until it
// is done, so a release or a broken stream never unmaps memory in use.
#ifndef FLCE_SERVER_STATE_SHARED_REGIONS_H_
#define FLCE_SERVER_STATE_SHARED_REGIONS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/server_context.h"
#include "kernels/engine.h"
#include "server/state/local_peers.h"

namespace flce::server {

// One mmap of a shared-memory object (unmapped when the last holder goes),
// page-locked for the engine's GPU where it has one; or peer device memory
// the engine opened (closed likewise).
class MappedRegion {
 public:
  MappedRegion(void* base, int64_t bytes) : base_(static_cast<char*>(base)), bytes_(bytes) {}
  explicit MappedRegion(std::shared_ptr<const PeerMemory> device)
      : bytes_(device->bytes()), device_(std::move(device)) {}
  ~MappedRegion();
  MappedRegion(const MappedRegion&) = delete;
  MappedRegion& operator=(const MappedRegion&) = delete;

  // Host memory; null for a device region.
  char* base() const { return base_; }
  // What the engine's GPU reads and writes directly: a device region, or a
  // shared-memory one page-locked for it; null when the host copies.
  const PeerMemory* device() const { return device_.get(); }
  // Before the region is shared: the engine's page-locked view of it.
  void set_device(std::shared_ptr<const PeerMemory> device) { device_ = std::move(device); }
  int64_t bytes() const { return bytes_; }
  // INVALID_ARGUMENT unless [offset, offset + length) lies inside the region.
  absl::Status CheckRange(int64_t offset, int64_t length, const char* what) const;

 private:
  char* base_ = nullptr;
  int64_t bytes_;
  std::shared_ptr<const PeerMemory> device_;
};

// The host's boot id (/proc/sys/kernel/random/boot_id), "" when unreadable.
std::string HostBootId();

class SharedRegions {
 public:
  static constexpr int kMaxRegionsPerStream = 64;

  // Which kinds may be registered: host shared memory (shm), and device
  // memory opened by `engine` (cuda_ipc; engine must then be non-null).
  // page_lock: the engine that page-locks shm regions for its GPU (the CUDA
  // engine), so that calls copy by DMA; null = the host copies.
  struct Kinds {
    bool shm = false;
    Engine* cuda_ipc = nullptr;
    Engine* page_lock = nullptr;
  };
  // max_bytes_per_tenant: region bytes one tenant may hold registered at
  // once, over all its streams (0 = no cap).
  SharedRegions(absl::Duration lease, Kinds kinds, int64_t max_bytes_per_tenant = 0)
      : lease_(lease), kinds_(kinds), max_bytes_per_tenant_(max_bytes_per_tenant) {}
  bool allows_shm() const { return kinds_.shm; }
  bool allows_cuda_ipc() const { return kinds_.cuda_ipc != nullptr; }

  absl::Duration lease() const { return lease_; }

  // A new registration stream's id. `call` (may be null in tests) is cancelled
  // when the stream's lease runs out or the server shuts down: its reactor
  // then ends as if the client had gone. Valid until CloseStream. `offer`:
  // the kinds its caller may register (LocalPeers::OfferTo); the rest are
  // refused with PERMISSION_DENIED.
  uint64_t OpenStream(const std::string& tenant, grpc::ServerContextBase* call = nullptr,
                      LocalOffer offer = LocalOffer{true, true, ""});
  static constexpr size_t kKeyBytes = 16;

  // Maps `bytes` of the object `name` for the stream when its first 16 bytes
  // are `key` (PERMISSION_DENIED otherwise); returns the region id.
  absl::StatusOr<std::string> Register(uint64_t stream, const std::string& name, int64_t bytes,
                                       const std::string& key);
  // Opens device memory with the engine (cuda_ipc); the same rules.
  absl::StatusOr<std::string> RegisterDevice(uint64_t stream, const PeerMemoryHandle& handle);
  // Why Register or RegisterDevice failed, as flce_region_refusals_total's
  // reason label ("tenant_cap", "open_failed", ...).
  static std::string RefusalReason(const absl::Status& status);
  absl::Status Release(uint64_t stream, const std::string& region_id);
  void Renew(uint64_t stream);
  // Releases every region of the stream (its holders keep their mappings).
  void CloseStream(uint64_t stream);
  // Shutdown: cancels every registration stream, which would otherwise keep the
  // server waiting for the whole drain.
  void CancelAllStreams();

  // The region for a Compute call of `tenant`: NOT_FOUND when there is no
  // such region for this tenant (another tenant's looks the same), or when
  // its stream's lease ran out (the stream's regions are released then).
  absl::StatusOr<std::shared_ptr<const MappedRegion>> Find(const std::string& tenant,
                                                           const std::string& region_id);

  int64_t mapped_bytes() const;
  int64_t regions() const;

 private:
  struct Region {
    std::string name;
    std::shared_ptr<const MappedRegion> mapping;
  };
  struct Stream {
    std::string tenant;
    grpc::ServerContextBase* call = nullptr;
    LocalOffer offer;
    absl::Time lease_until;
    std::map<std::string, Region> regions;  // by region id
  };

  void ExpireLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Before a region of `bytes` is opened for `stream`: the stream exists, may
  // register `kind` (shm or cuda_ipc) and has room, and its tenant stays
  // within max_bytes_per_tenant_.
  absl::Status CheckRoomLocked(uint64_t stream, bool device, int64_t bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<std::string> Add(uint64_t stream, std::string name,
                                  std::shared_ptr<const MappedRegion> mapping);

  const absl::Duration lease_;
  const Kinds kinds_;
  const int64_t max_bytes_per_tenant_;
  mutable absl::Mutex mu_;
  uint64_t next_stream_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, Stream> streams_ ABSL_GUARDED_BY(mu_);
};

}  // namespace flce::server

#endif  // FLCE_SERVER_STATE_SHARED_REGIONS_H_
