#include "server/base/receive_buffers.h"

#include <algorithm>
#include <utility>

namespace flce::server {

ReceiveBuffers& ReceiveBuffers::Shared() {
  static ReceiveBuffers* const shared = new ReceiveBuffers();
  return *shared;
}

std::string ReceiveBuffers::Take(size_t bytes) {
  std::string buffer;
  {
    absl::MutexLock lock(&mu_);
    auto same = std::find_if(kept_.begin(), kept_.end(),
                             [&](const std::string& b) { return b.size() == bytes; });
    if (same == kept_.end()) {
      same = std::find_if(kept_.begin(), kept_.end(),
                          [&](const std::string& b) { return b.capacity() >= bytes; });
    }
    if (same != kept_.end()) {
      kept_bytes_ -= same->capacity();
      buffer = std::move(*same);
      kept_.erase(same);
    }
  }
  // Zero-fills only what a shorter kept buffer lacks.
  buffer.resize(bytes);
  return buffer;
}

void ReceiveBuffers::Return(std::string buffer) {
  const size_t bytes = buffer.capacity();
  if (bytes < kMinBytes) return;
  absl::MutexLock lock(&mu_);
  if (kept_bytes_ + bytes > max_kept_bytes_) return;
  kept_bytes_ += bytes;
  kept_.push_back(std::move(buffer));
}

size_t ReceiveBuffers::kept_bytes() const {
  absl::MutexLock lock(&mu_);
  return kept_bytes_;
}

}  // namespace flce::server
