// Compute's hidden states and grad_input through POSIX shared memory, for a
// client on the server's host (flce-server --local-transports=shm): the same
// regions and Regions stream as the Python client's flce.shm.
//
// A region is a shared-memory object named "flce-" + 32 random hex digits,
// created with mode 0600 and O_EXCL, with 16 random bytes written at its
// start (the proof, RegisterRegion.key, that this client can write it),
// registered on one Regions stream and unlinked once the server has mapped
// it. A thread renews the stream's lease; destroying the transport (or losing
// the stream) releases every region on the server. Calls that run at the same
// time use different regions.
#ifndef FLCE_CLIENT_CPP_SHARED_MEMORY_TRANSPORT_H_
#define FLCE_CLIENT_CPP_SHARED_MEMORY_TRANSPORT_H_

#include <grpcpp/client_context.h>

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "flce/v1/flce.grpc.pb.h"

namespace flce {

// How a region that /dev/shm has no room for is refused (the message's start).
inline constexpr absl::string_view kShmNoRoom = "/dev/shm has no room";

// Whether the server that answered `info` runs on this host (its boot id,
// /proc/sys/kernel/random/boot_id, is this host's; not when either is unknown).
bool OnThisHost(const v1::ServerInfo& info);

// A mapped shared-memory object, registered with the server.
class SharedRegion {
 public:
  // stream: which Regions stream of the transport registered it.
  SharedRegion(void* data, int64_t bytes, std::string region_id, uint64_t stream)
      : data_(static_cast<char*>(data)),
        bytes_(bytes),
        region_id_(std::move(region_id)),
        stream_(stream) {}
  ~SharedRegion();
  SharedRegion(const SharedRegion&) = delete;
  SharedRegion& operator=(const SharedRegion&) = delete;

  char* data() const { return data_; }
  int64_t bytes() const { return bytes_; }
  const std::string& region_id() const { return region_id_; }
  uint64_t stream() const { return stream_; }

 private:
  char* data_;
  int64_t bytes_;
  std::string region_id_;
  uint64_t stream_;
};

class SharedMemoryTransport {
 public:
  // Prepares a call's context (deadline, bearer token) for the Regions stream.
  using PrepareContext = std::function<void(grpc::ClientContext&)>;

  SharedMemoryTransport(v1::Flce::Stub* stub, PrepareContext prepare);
  // Ends the stream: the server releases every region.
  ~SharedMemoryTransport();
  SharedMemoryTransport(const SharedMemoryTransport&) = delete;
  SharedMemoryTransport& operator=(const SharedMemoryTransport&) = delete;

  // A free region of at least `bytes` (registering one, a quarter larger,
  // when none fits). Errors are the server's answer to the registration
  // (e.g. PERMISSION_DENIED when it may not open this user's objects).
  absl::StatusOr<std::shared_ptr<SharedRegion>> Acquire(int64_t bytes);
  // The region is free for the next call.
  void GiveBack(std::shared_ptr<SharedRegion> region);

 private:
  class Stream;

  v1::Flce::Stub* stub_;
  PrepareContext prepare_;
  std::mutex mu_;
  std::unique_ptr<Stream> stream_;                    // guarded by mu_
  uint64_t streams_opened_ = 0;                       // guarded by mu_; numbers stream_
  std::vector<std::shared_ptr<SharedRegion>> free_;  // guarded by mu_
};

}  // namespace flce

#endif  // FLCE_CLIENT_CPP_SHARED_MEMORY_TRANSPORT_H_
