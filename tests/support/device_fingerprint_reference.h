// The host reference of the fingerprint an engine reports for hidden rows it
// read on the device (PeerRows::fingerprint): the sum (mod 2^64) over rows of
// Mix64(row sum + token index), where a row's sum is that of
// Mix64(element bits | column << 32) over its elements (16 or 32 bits each),
// kernels/device_fingerprint.h's arithmetic. It is not the server's
// HiddenFingerprint of rows that came in messages.
#ifndef FLCE_TESTS_SUPPORT_DEVICE_FINGERPRINT_REFERENCE_H_
#define FLCE_TESTS_SUPPORT_DEVICE_FINGERPRINT_REFERENCE_H_

#include <cstdint>

#include "core/dtype.h"

namespace flce {

uint64_t DeviceHiddenFingerprint(DType dtype, const void* rows, int64_t n, int64_t hidden_size,
                                 int64_t first_token);

}  // namespace flce

#endif  // FLCE_TESTS_SUPPORT_DEVICE_FINGERPRINT_REFERENCE_H_
