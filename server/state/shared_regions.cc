#include "server/state/shared_regions.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <random>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/cord.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "server/base/guarded_copy.h"
#include "server/observe/log.h"

namespace flce::server {
namespace {

constexpr absl::string_view kNamePrefix = "flce-";
constexpr size_t kNameHexDigits = 32;  // 128 random bits: not guessable by another tenant

absl::Status CheckName(const std::string& name) {
  absl::string_view bare = name;
  absl::ConsumePrefix(&bare, "/");
  bool ok = absl::ConsumePrefix(&bare, kNamePrefix) && bare.size() == kNameHexDigits;
  for (char c : bare) ok = ok && (absl::ascii_isdigit(c) || (c >= 'a' && c <= 'f'));
  if (!ok) {
    return absl::InvalidArgumentError(absl::StrCat(
        "region name \"", absl::CEscape(name.substr(0, 80)),
        "\" is not \"flce-\" followed by 32 lowercase hex digits (128 random bits)"));
  }
  return absl::OkStatus();
}

constexpr absl::string_view kRefusalPayload = "type.flce.dev/region_refusal";

// `status` tagged with its flce_region_refusals_total reason.
absl::Status Refusal(absl::string_view reason, absl::Status status) {
  status.SetPayload(kRefusalPayload, absl::Cord(reason));
  return status;
}

std::string RandomRegionId() {
  std::random_device random;
  std::string id = "r-";
  for (int i = 0; i < 4; ++i) absl::StrAppend(&id, absl::Hex(random(), absl::kZeroPad8));
  return id;
}

}  // namespace

MappedRegion::~MappedRegion() {
  device_.reset();  // unlocked before it is unmapped
  if (base_ != nullptr) munmap(base_, static_cast<size_t>(bytes_));
}

absl::Status MappedRegion::CheckRange(int64_t offset, int64_t length, const char* what) const {
  if (offset < 0 || length < 0 || offset > bytes_ || length > bytes_ - offset) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": bytes [", offset, ", ", offset,
                                                   " + ", length, ") are outside the region's ",
                                                   bytes_, " bytes"));
  }
  return absl::OkStatus();
}

std::string HostBootId() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(in, id);
  return std::string(absl::StripAsciiWhitespace(id));
}

uint64_t SharedRegions::OpenStream(const std::string& tenant, grpc::ServerContextBase* call,
                                   LocalOffer offer) {
  absl::MutexLock lock(&mu_);
  uint64_t id = next_stream_++;
  streams_[id] = Stream{tenant, call, std::move(offer), absl::Now() + lease_, {}};
  return id;
}

absl::Status SharedRegions::CheckRoomLocked(uint64_t stream, bool device, int64_t bytes) {
  auto it = streams_.find(stream);
  if (it == streams_.end()) {
    return absl::FailedPreconditionError("the registration stream's lease ran out");
  }
  const Stream& s = it->second;
  if (!(device ? s.offer.cuda_ipc : s.offer.shm)) {
    return Refusal("kind_not_offered", absl::PermissionDeniedError(absl::StrCat(
        "this connection may not register ", device ? "CUDA IPC memory" : "shared memory",
        s.offer.refusal.empty() ? std::string() : absl::StrCat(": ", s.offer.refusal))));
  }
  if (s.regions.size() >= kMaxRegionsPerStream) {
    return Refusal("region_limit", absl::ResourceExhaustedError(absl::StrCat(
                                       "a registration stream holds at most ",
                                       kMaxRegionsPerStream, " regions")));
  }
  if (max_bytes_per_tenant_ > 0) {
    int64_t held = 0;
    for (const auto& [id, other] : streams_) {
      if (other.tenant != s.tenant) continue;
      for (const auto& [rid, region] : other.regions) held += region.mapping->bytes();
    }
    if (bytes > max_bytes_per_tenant_ - held) {
      return Refusal("tenant_cap",
                     absl::ResourceExhaustedError(absl::StrCat(
                         "this tenant holds ", held, " bytes of regions registered; ", bytes,
                         " more would pass the server's cap of ", max_bytes_per_tenant_,
                         " bytes per tenant (--max-region-mb): release regions first, or send "
                         "messages")));
    }
  }
  return absl::OkStatus();
}

void SharedRegions::CancelAllStreams() {
  absl::MutexLock lock(&mu_);
  // TryCancel only queues the cancellation: the reactors end on gRPC's
  // threads and CloseStream then removes them.
  for (auto& [id, stream] : streams_) {
    if (stream.call != nullptr) stream.call->TryCancel();
  }
}

absl::StatusOr<std::string> SharedRegions::Register(uint64_t stream, const std::string& name,
                                                    int64_t bytes, const std::string& key) {
  if (!kinds_.shm) {
    return Refusal("kind_not_offered", absl::FailedPreconditionError(
                                     "this server takes no shared-memory regions (start it with "
                                     "--local-transports=shm)"));
  }
  if (absl::Status s = CheckName(name); !s.ok()) return s;
  if (bytes < static_cast<int64_t>(kKeyBytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat("region bytes = ", bytes, ": must be at least ", kKeyBytes));
  }
  if (key.size() != kKeyBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "region key holds ", key.size(), " bytes, not ", kKeyBytes,
        ": write 16 random bytes at the object's start and send them as the key"));
  }
  {
    // Fail before opening (and page-locking) anything.
    absl::MutexLock lock(&mu_);
    ExpireLocked(absl::Now());
    if (absl::Status room = CheckRoomLocked(stream, /*device=*/false, bytes); !room.ok()) {
      return room;
    }
  }
  const std::string path = absl::StartsWith(name, "/") ? name : "/" + name;
  const int fd = shm_open(path.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC, 0);
  if (fd < 0) {
    const int err = errno;
    return err == EACCES ? absl::PermissionDeniedError(absl::StrCat(
                               "region \"", name, "\": the server may not open it (",
                               strerror(err), "): it runs as another user"))
                         : absl::NotFoundError(absl::StrCat("region \"", name, "\": ",
                                                            strerror(err)));
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size < bytes) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat(
        "region \"", name, "\" holds ", static_cast<int64_t>(st.st_size),
        " bytes, fewer than the ", bytes, " registered"));
  }
  void* base = mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (base == MAP_FAILED) {
    return absl::ResourceExhaustedError(
        absl::StrCat("region \"", name, "\": mmap of ", bytes, " bytes failed: ", strerror(errno)));
  }
  auto mapping = std::make_shared<MappedRegion>(base, bytes);
  // The caller proves that it can write the object: a name alone (visible in
  // /dev/shm to every local user) must not map another user's memory.
  char start[kKeyBytes];
  if (absl::Status read = GuardedCopy(start, mapping->base(), kKeyBytes); !read.ok()) return read;
  if (std::memcmp(start, key.data(), kKeyBytes) != 0) {
    return absl::PermissionDeniedError(absl::StrCat(
        "region \"", name, "\": its first 16 bytes are not the key sent: only the client that "
        "wrote them may register it"));
  }
  if (kinds_.page_lock != nullptr) {
    // Page-locked, the GPU copies straight from (and into) the region; where
    // that is refused the host copies, as on the CPU engine.
    absl::StatusOr<std::shared_ptr<const PeerMemory>> locked =
        kinds_.page_lock->RegisterHostMemory(mapping->base(), bytes);
    if (locked.ok()) {
      mapping->set_device(std::move(*locked));
    } else {
      LogWarning(absl::StrCat("region \"", name, "\" is copied by the host: ",
                              locked.status().message()));
    }
  }
  return Add(stream, name, std::move(mapping));
}

absl::StatusOr<std::string> SharedRegions::RegisterDevice(uint64_t stream,
                                                          const PeerMemoryHandle& handle) {
  if (kinds_.cuda_ipc == nullptr) {
    return Refusal("kind_not_offered",
                   absl::FailedPreconditionError(
                       "this server takes no CUDA IPC regions (start it with "
                       "--local-transports=cuda_ipc on a GPU); send hidden by shared memory or "
                       "messages"));
  }
  {
    // Fail before opening anything.
    absl::MutexLock lock(&mu_);
    ExpireLocked(absl::Now());
    if (absl::Status room = CheckRoomLocked(stream, /*device=*/true, handle.bytes); !room.ok()) {
      return room;
    }
  }
  absl::StatusOr<std::shared_ptr<const PeerMemory>> memory = kinds_.cuda_ipc->OpenPeerMemory(handle);
  if (!memory.ok()) return memory.status();
  return Add(stream, "cuda_ipc", std::make_shared<const MappedRegion>(std::move(*memory)));
}

std::string SharedRegions::RefusalReason(const absl::Status& status) {
  if (auto reason = status.GetPayload(kRefusalPayload)) {
    return std::string(*reason);
  }
  // Untagged: the request itself was malformed, or opening what it names failed.
  return status.code() == absl::StatusCode::kInvalidArgument ? "invalid" : "open_failed";
}

absl::StatusOr<std::string> SharedRegions::Add(uint64_t stream, std::string name,
                                               std::shared_ptr<const MappedRegion> mapping) {
  absl::MutexLock lock(&mu_);
  ExpireLocked(absl::Now());
  // Again: another registration of the tenant may have landed meanwhile.
  const bool device = mapping->base() == nullptr;  // CUDA IPC memory has no host view
  if (absl::Status room = CheckRoomLocked(stream, device, mapping->bytes()); !room.ok()) {
    return room;
  }
  auto it = streams_.find(stream);
  std::string id = RandomRegionId();
  it->second.regions[id] = Region{std::move(name), std::move(mapping)};
  it->second.lease_until = absl::Now() + lease_;
  return id;
}

absl::Status SharedRegions::Release(uint64_t stream, const std::string& region_id) {
  absl::MutexLock lock(&mu_);
  auto it = streams_.find(stream);
  if (it == streams_.end() || it->second.regions.erase(region_id) == 0) {
    return absl::NotFoundError(absl::StrCat("no region \"", absl::CEscape(region_id.substr(0, 80)),
                                            "\" on this stream"));
  }
  it->second.lease_until = absl::Now() + lease_;
  return absl::OkStatus();
}

void SharedRegions::Renew(uint64_t stream) {
  absl::MutexLock lock(&mu_);
  auto it = streams_.find(stream);
  if (it != streams_.end()) it->second.lease_until = absl::Now() + lease_;
}

void SharedRegions::CloseStream(uint64_t stream) {
  absl::MutexLock lock(&mu_);
  streams_.erase(stream);
}

absl::StatusOr<std::shared_ptr<const MappedRegion>> SharedRegions::Find(
    const std::string& tenant, const std::string& region_id) {
  absl::MutexLock lock(&mu_);
  ExpireLocked(absl::Now());
  for (const auto& [id, stream] : streams_) {
    if (stream.tenant != tenant) continue;
    auto region = stream.regions.find(region_id);
    if (region != stream.regions.end()) return region->second.mapping;
  }
  return absl::NotFoundError(absl::StrCat(
      "no region \"", absl::CEscape(region_id.substr(0, 80)),
      "\" (released, its Regions stream ended or its lease ran out, or another tenant's)"));
}

void SharedRegions::ExpireLocked(absl::Time now) {
  for (auto it = streams_.begin(); it != streams_.end();) {
    if (it->second.lease_until >= now) {
      ++it;
      continue;
    }
    // The client learns that its regions are gone: its stream ends.
    if (it->second.call != nullptr) it->second.call->TryCancel();
    it = streams_.erase(it);
  }
}

int64_t SharedRegions::mapped_bytes() const {
  absl::MutexLock lock(&mu_);
  int64_t total = 0;
  for (const auto& [id, stream] : streams_) {
    for (const auto& [rid, region] : stream.regions) total += region.mapping->bytes();
  }
  return total;
}

int64_t SharedRegions::regions() const {
  absl::MutexLock lock(&mu_);
  int64_t n = 0;
  for (const auto& [id, stream] : streams_) n += static_cast<int64_t>(stream.regions.size());
  return n;
}

}  // namespace flce::server
