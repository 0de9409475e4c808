#include "kernels/held_rows.h"

#include <algorithm>
#include <mutex>
#include <utility>
#include <vector>

namespace flce {
namespace {

struct Kept {
  std::unique_ptr<char[]> buffer;
  int64_t capacity;
};

std::mutex& KeptMu() {
  static std::mutex mu;
  return mu;
}

std::vector<Kept>& KeptBuffers() {
  static std::vector<Kept>* kept = new std::vector<Kept>();  // outlives every call
  return *kept;
}

}  // namespace

HeldRows::HeldRows(int64_t bytes) {
  bytes = std::max<int64_t>(bytes, 1);
  {
    std::lock_guard<std::mutex> lock(KeptMu());
    std::vector<Kept>& kept = KeptBuffers();
    auto best = kept.end();
    for (auto it = kept.begin(); it != kept.end(); ++it) {
      if (it->capacity >= bytes && (best == kept.end() || it->capacity < best->capacity)) best = it;
    }
    if (best != kept.end()) {
      buffer_ = std::move(best->buffer);
      capacity_ = best->capacity;
      kept.erase(best);
      return;
    }
  }
  buffer_.reset(new char[bytes]);
  capacity_ = bytes;
}

HeldRows::~HeldRows() { Release(); }

HeldRows::HeldRows(HeldRows&& other) noexcept
    : buffer_(std::move(other.buffer_)), capacity_(std::exchange(other.capacity_, 0)) {}

HeldRows& HeldRows::operator=(HeldRows&& other) noexcept {
  if (this != &other) {
    Release();
    buffer_ = std::move(other.buffer_);
    capacity_ = std::exchange(other.capacity_, 0);
  }
  return *this;
}

void HeldRows::Release() {
  if (buffer_ == nullptr) return;
  std::lock_guard<std::mutex> lock(KeptMu());
  std::vector<Kept>& kept = KeptBuffers();
  kept.push_back({std::move(buffer_), capacity_});
  capacity_ = 0;
  if (static_cast<int>(kept.size()) > kKeptBuffers) {
    // The smallest goes: a larger buffer serves every call a smaller one would.
    auto smallest = std::min_element(kept.begin(), kept.end(), [](const Kept& a, const Kept& b) {
      return a.capacity < b.capacity;
    });
    kept.erase(smallest);
  }
}

int64_t HeldRows::KeptBytes() {
  std::lock_guard<std::mutex> lock(KeptMu());
  int64_t total = 0;
  for (const Kept& k : KeptBuffers()) total += k.capacity;
  return total;
}

void HeldRows::DropKept() {
  std::vector<Kept> dropped;
  {
    std::lock_guard<std::mutex> lock(KeptMu());
    dropped.swap(KeptBuffers());
  }
}

}  // namespace flce
