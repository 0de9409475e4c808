// memcpy to or from memory another process may shrink under us (a client's
// shared-memory region: it can ftruncate the object after registering it).
// Touching a page past the object's end raises SIGBUS; here that fault ends
// the copy with FAILED_PRECONDITION instead of the server.
#ifndef FLCE_SERVER_BASE_GUARDED_COPY_H_
#define FLCE_SERVER_BASE_GUARDED_COPY_H_

#include <cstddef>

#include "absl/status/status.h"

namespace flce::server {

absl::Status GuardedCopy(void* dst, const void* src, size_t bytes);

}  // namespace flce::server

#endif  // FLCE_SERVER_BASE_GUARDED_COPY_H_
