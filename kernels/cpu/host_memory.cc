#include "kernels/cpu/host_memory.h"

#include <unistd.h>

#include "absl/strings/str_cat.h"

namespace flce::cpu {
namespace {

int64_t PhysicalBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page_size <= 0) return -1;  // unknown: rely on bad_alloc
  int64_t bytes = 0;
  if (__builtin_mul_overflow(static_cast<int64_t>(pages), static_cast<int64_t>(page_size),
                             &bytes)) {
    return -1;
  }
  return bytes;
}

}  // namespace

absl::StatusOr<int64_t> HostBytes(const char *what, std::initializer_list<int64_t> factors) {
  int64_t product = 1;
  for (int64_t f : factors) {
    if (f < 0 || __builtin_mul_overflow(product, f, &product)) {
      return absl::ResourceExhaustedError(absl::StrCat(what, ": the size does not fit in 64 bits"));
    }
  }
  return product;
}

absl::Status CheckHostBytes(const char *what, int64_t bytes) {
  const int64_t physical = PhysicalBytes();
  if (physical > 0 && bytes > physical) {
    return absl::ResourceExhaustedError(
        absl::StrCat(what, " needs ", bytes, " bytes of host memory; the machine has ", physical));
  }
  return absl::OkStatus();
}

absl::Status AllocationFailed(const char *what, int64_t bytes) {
  return absl::ResourceExhaustedError(
      absl::StrCat("cannot allocate ", bytes, " bytes of host memory for ", what));
}

}  // namespace flce::cpu
