// Buffers that received hidden rows are read into, kept for the next frames.
// A fresh multi-MiB string per frame is zero-filled by resize before the
// socket's bytes overwrite it and, once the allocator has handed freed memory
// back to the kernel, faulted in anew page by page, on the thread that reads
// the connection; a kept buffer of the frame's size is neither
// (docs/perf/python.md, Step 22). The data plane takes its frames' buffers
// here and the Compute job returns each once the engine has the rows.
//
//   std::string frame = ReceiveBuffers::Shared().Take(bytes);   // read into it
//   ... engine->AddHidden(...);
//   ReceiveBuffers::Shared().Return(std::move(frame));
#ifndef FLCE_SERVER_BASE_RECEIVE_BUFFERS_H_
#define FLCE_SERVER_BASE_RECEIVE_BUFFERS_H_

#include <cstddef>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace flce::server {

class ReceiveBuffers {
 public:
  // Buffers below this are not worth keeping (the allocator reuses them itself).
  static constexpr size_t kMinBytes = size_t{256} << 10;
  // The process's kept buffers together: 16 frames of the clients' 4 MiB default.
  static constexpr size_t kMaxKeptBytes = size_t{64} << 20;

  explicit ReceiveBuffers(size_t max_kept_bytes = kMaxKeptBytes)
      : max_kept_bytes_(max_kept_bytes) {}
  // The process's buffers (the data plane's connections and the Compute jobs).
  static ReceiveBuffers& Shared();

  // A string of `bytes` bytes whose content is unspecified: a kept buffer of
  // that size where there is one (no zero-filling), else a large enough one,
  // else a new one.
  std::string Take(size_t bytes);
  // Keeps `buffer` for a later Take, unless it is small or keeping it would
  // hold more than the cap; then it is freed.
  void Return(std::string buffer);
  // The capacity of the buffers kept now.
  size_t kept_bytes() const;

 private:
  const size_t max_kept_bytes_;
  mutable absl::Mutex mu_;
  std::vector<std::string> kept_ ABSL_GUARDED_BY(mu_);
  size_t kept_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace flce::server

#endif  // FLCE_SERVER_BASE_RECEIVE_BUFFERS_H_
