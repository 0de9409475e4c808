// DeviceHiddenFingerprint's arithmetic (engine.h), shared by the host
// reference and the CUDA kernel that computes it where the rows are.
#ifndef FLCE_KERNELS_DEVICE_FINGERPRINT_H_
#define FLCE_KERNELS_DEVICE_FINGERPRINT_H_

#include <cstdint>

#if defined(__CUDACC__)
#define FLCE_HOST_DEVICE __host__ __device__
#else
#define FLCE_HOST_DEVICE
#endif

namespace flce {

// splitmix64's finaliser: a bijection that spreads every input bit.
FLCE_HOST_DEVICE inline uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// One element's term in its row's sum: its bits keyed by its column, so
// that swapping two elements of a row changes the row's hash.
FLCE_HOST_DEVICE inline uint64_t ElementTerm(uint32_t bits, int64_t column) {
  return Mix64(static_cast<uint64_t>(bits) | (static_cast<uint64_t>(column) << 32));
}

// A row's hash from the sum of its element terms, keyed by its token index.
FLCE_HOST_DEVICE inline uint64_t RowTerm(uint64_t element_sum, int64_t token) {
  return Mix64(element_sum + static_cast<uint64_t>(token));
}

}  // namespace flce

#endif  // FLCE_KERNELS_DEVICE_FINGERPRINT_H_
