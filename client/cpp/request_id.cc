#include "client/cpp/request_id.h"

#include <random>

#include "absl/strings/str_format.h"

namespace flce {

std::string NewRequestId() {
  // One generator per thread, seeded from the OS: processes started in the
  // same instant (a fleet of trainer ranks) still get distinct ids.
  thread_local std::mt19937_64 generator = [] {
    std::random_device device;
    std::seed_seq seed{device(), device(), device(), device(), device(), device()};
    return std::mt19937_64(seed);
  }();
  const uint64_t hi = generator();
  const uint64_t lo = generator();
  return absl::StrFormat("%016x%016x", hi, lo);
}

}  // namespace flce
