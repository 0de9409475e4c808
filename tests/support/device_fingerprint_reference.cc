#include "tests/support/device_fingerprint_reference.h"

#include <cstring>

#include "kernels/device_fingerprint.h"

namespace flce {

uint64_t DeviceHiddenFingerprint(DType dtype, const void* rows, int64_t n, int64_t hidden_size,
                                 int64_t first_token) {
  const int64_t size = DTypeSize(dtype);
  const char* p = static_cast<const char*>(rows);
  uint64_t total = 0;
  for (int64_t r = 0; r < n; ++r) {
    uint64_t sum = 0;
    for (int64_t j = 0; j < hidden_size; ++j, p += size) {
      uint32_t bits = 0;
      if (size == 2) {
        uint16_t half;
        std::memcpy(&half, p, 2);
        bits = half;
      } else {
        std::memcpy(&bits, p, 4);
      }
      sum += ElementTerm(bits, j);
    }
    total += RowTerm(sum, first_token + r);
  }
  return total;
}

}  // namespace flce
