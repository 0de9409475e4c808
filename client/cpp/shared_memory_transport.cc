#include "client/cpp/shared_memory_transport.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/cpp/grpc_status.h"

namespace flce {
namespace {

std::string RandomBytes(int n) {
  std::random_device random;  // the kernel's generator on Linux
  std::string out;
  while (static_cast<int>(out.size()) < n) {
    const uint32_t word = random();
    out.append(reinterpret_cast<const char*>(&word), std::min<size_t>(4, n - out.size()));
  }
  return out;
}

std::string HexOf(const std::string& bytes) {
  std::string hex;
  for (unsigned char c : bytes) hex += absl::StrFormat("%02x", c);
  return hex;
}

absl::Status Errno(const std::string& what) {
  return absl::UnavailableError(absl::StrCat(what, ": ", std::strerror(errno)));
}

}  // namespace

bool OnThisHost(const v1::ServerInfo& info) {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(in, id);
  return !id.empty() && id == info.boot_id();
}

SharedRegion::~SharedRegion() { munmap(data_, static_cast<size_t>(bytes_)); }

// One Regions stream: a registration or release and its answer at a time,
// and renewals from a thread of its own.
class SharedMemoryTransport::Stream {
 public:
  Stream(v1::Flce::Stub* stub, const PrepareContext& prepare, uint64_t id) : id_(id) {
    prepare(context_);
    stream_ = stub->Regions(&context_);
    renewer_ = std::thread([this] { Renew(); });
  }

  ~Stream() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    wake_.notify_all();
    renewer_.join();
    std::lock_guard<std::mutex> lock(io_mu_);
    if (!finished_) {
      // The server releases every region of a stream that ends, however it ends.
      context_.TryCancel();
      v1::RegionResponse ignored;
      while (stream_->Read(&ignored)) {
      }
      stream_->Finish();
    }
  }

  bool broken() {
    std::lock_guard<std::mutex> lock(io_mu_);
    return finished_;
  }

  absl::StatusOr<std::shared_ptr<SharedRegion>> Register(int64_t bytes) {
    const std::string name = "flce-" + HexOf(RandomBytes(16));
    const int fd = shm_open(("/" + name).c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) return Errno("shm_open /" + name);
    void* data = MAP_FAILED;
    absl::Status mapped;
    // The pages are claimed now: on a full /dev/shm (a container's is 64 MiB
    // by default) writing into a sparse object would raise SIGBUS here.
    if (const int err = ftruncate(fd, bytes) == 0 ? posix_fallocate(fd, 0, bytes) : errno;
        err != 0) {
      errno = err;  // posix_fallocate returns its error instead
      mapped = err == ENOSPC ? absl::ResourceExhaustedError(absl::StrCat(
                                   kShmNoRoom, " for ", bytes, " bytes (",
                                   std::strerror(err), ")"))
                             : Errno(absl::StrCat("sizing /", name, " to ", bytes, " bytes"));
    } else {
      data = mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (data == MAP_FAILED) mapped = Errno(absl::StrCat("mapping ", bytes, " bytes of /", name));
    }
    close(fd);
    if (!mapped.ok()) {
      shm_unlink(("/" + name).c_str());
      return mapped;
    }
    // The proof that this client can write the object: its name is visible
    // in /dev/shm to every process on the host.
    const std::string key = RandomBytes(16);
    std::memcpy(data, key.data(), key.size());
    v1::RegionRequest request;
    v1::RegisterRegion* reg = request.mutable_register_();
    reg->set_name(name);
    reg->set_bytes(bytes);
    reg->set_key(key);
    absl::StatusOr<v1::RegionResponse> answer = Ask(request);
    // Mapped by the server (or refused): nothing may open it by name any more.
    shm_unlink(("/" + name).c_str());
    if (!answer.ok()) {
      munmap(data, static_cast<size_t>(bytes));
      return answer.status();
    }
    return std::make_shared<SharedRegion>(data, bytes, answer->region_id(), id_);
  }

  void Release(const SharedRegion& region) {
    v1::RegionRequest request;
    request.mutable_release()->set_region_id(region.region_id());
    (void)Ask(request);  // a stream that is gone released it already
  }

 private:
  absl::StatusOr<v1::RegionResponse> Ask(const v1::RegionRequest& request) {
    std::lock_guard<std::mutex> lock(io_mu_);
    if (finished_) return absl::UnavailableError("the Regions stream has ended");
    v1::RegionResponse response;
    if (stream_->Write(request) && stream_->Read(&response)) {
      if (response.lease_s() > 0) {
        const std::chrono::milliseconds every(
            std::max<int64_t>(500, static_cast<int64_t>(response.lease_s() * 1000 / 3)));
        std::lock_guard<std::mutex> renew_lock(mu_);
        if (every != renew_every_) {
          renew_every_ = every;
          ++period_changes_;
          wake_.notify_all();  // a wait begun with the old period would outlast a short lease
        }
      }
      return response;
    }
    // A refused registration ends the stream with the server's reason.
    finished_ = true;
    absl::Status status = FromGrpcStatus(stream_->Finish());
    return status.ok() ? absl::UnavailableError("the server ended the Regions stream") : status;
  }

  void Renew() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_) {
      const uint64_t period = period_changes_;
      // Any message renews the lease, the answer that set the period too: a
      // new period is waited from now.
      if (wake_.wait_for(lock, renew_every_,
                         [&] { return stop_ || period_changes_ != period; })) {
        continue;
      }
      lock.unlock();
      {
        std::lock_guard<std::mutex> io(io_mu_);
        v1::RegionRequest renew;
        renew.set_renew(true);
        // No answer comes to a renewal; a failed write shows at the next Ask.
        if (!finished_) stream_->Write(renew);
      }
      lock.lock();
    }
  }

  const uint64_t id_;
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::RegionRequest, v1::RegionResponse>> stream_;
  std::mutex io_mu_;  // one message exchange at a time
  bool finished_ = false;
  std::mutex mu_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::chrono::milliseconds renew_every_{5000};  // until the server says its lease
  uint64_t period_changes_ = 0;
  std::thread renewer_;  // last: starts once the rest is ready
};

SharedMemoryTransport::SharedMemoryTransport(v1::Flce::Stub* stub, PrepareContext prepare)
    : stub_(stub), prepare_(std::move(prepare)) {}

SharedMemoryTransport::~SharedMemoryTransport() {
  std::lock_guard<std::mutex> lock(mu_);
  free_.clear();
  stream_.reset();
}

absl::StatusOr<std::shared_ptr<SharedRegion>> SharedMemoryTransport::Acquire(int64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stream_ != nullptr && stream_->broken()) {
    // Its regions are gone on the server: start over with a new stream.
    free_.clear();
    stream_.reset();
  }
  if (stream_ == nullptr) stream_ = std::make_unique<Stream>(stub_, prepare_, ++streams_opened_);
  auto best = free_.end();
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if ((*it)->bytes() >= bytes && (best == free_.end() || (*it)->bytes() < (*best)->bytes())) {
      best = it;
    }
  }
  if (best != free_.end()) {
    std::shared_ptr<SharedRegion> region = std::move(*best);
    free_.erase(best);
    return region;
  }
  if (!free_.empty()) {  // too small for this call: make room for a bigger one
    stream_->Release(*free_.front());
    free_.erase(free_.begin());
  }
  // A quarter more than asked, so that slightly larger calls reuse it.
  return stream_->Register(std::max<int64_t>(bytes + bytes / 4, int64_t{1} << 20));
}

void SharedMemoryTransport::GiveBack(std::shared_ptr<SharedRegion> region) {
  std::lock_guard<std::mutex> lock(mu_);
  // A region of a stream that has ended since is unknown to the server.
  if (stream_ != nullptr && !stream_->broken() && region->stream() == streams_opened_) {
    free_.push_back(std::move(region));
  }
}

}  // namespace flce
