// Host allocations whose size a client chooses (a head, a gradient buffer):
// sized with overflow-checked products and checked against the machine's
// memory before they are made. An absurd shape then becomes a
// RESOURCE_EXHAUSTED status naming the bytes, instead of a std::bad_alloc
// that would abort the server or a page-by-page fill that wakes the OOM
// killer.
//
// Usage:
//   FLCE_ASSIGN_OR_RETURN(int64_t bytes, HostBytes("head weight", {V, H, 4}));
//   FLCE_RETURN_IF_ERROR(CheckHostBytes("head weight", bytes));
//   FLCE_RETURN_IF_ERROR(TryAllocate("head weight", bytes, [&] { w.resize(V *
//   H); }));
#ifndef FLCE_KERNELS_CPU_HOST_MEMORY_H_
#define FLCE_KERNELS_CPU_HOST_MEMORY_H_

#include <cstdint>
#include <initializer_list>
#include <new>
#include <stdexcept>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace flce::cpu {

// The product of `factors` (each >= 0), or RESOURCE_EXHAUSTED when it does
// not fit an int64.
absl::StatusOr<int64_t> HostBytes(const char *what, std::initializer_list<int64_t> factors);

// RESOURCE_EXHAUSTED when `bytes` exceeds the machine's physical memory.
absl::Status CheckHostBytes(const char *what, int64_t bytes);

absl::Status AllocationFailed(const char *what, int64_t bytes);

// Runs `allocate`, turning std::bad_alloc (or length_error) into
// RESOURCE_EXHAUSTED.
template <typename Fn>
absl::Status TryAllocate(const char *what, int64_t bytes, Fn &&allocate) {
  try {
    allocate();
  } catch (const std::bad_alloc &) {
    return AllocationFailed(what, bytes);
  } catch (const std::length_error &) {
    return AllocationFailed(what, bytes);
  }
  return absl::OkStatus();
}

}  // namespace flce::cpu

#endif  // FLCE_KERNELS_CPU_HOST_MEMORY_H_
