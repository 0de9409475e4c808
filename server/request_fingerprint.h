// A 64-bit fingerprint of what a Compute call computes, so that a request id
// reused for other data is refused instead of being answered as a replay.
//
// Usage:
//   uint64_t fp = ComputeFingerprint(header);
//   store.BeginContribution(session, header.request_id(), fp);
#ifndef FLCE_SERVER_REQUEST_FINGERPRINT_H_
#define FLCE_SERVER_REQUEST_FINGERPRINT_H_

#include <cstdint>

#include "flce/v1/flce.pb.h"

namespace flce::server {

// Covers the fields that define the call's loss and gradients (head, targets,
// per-token weights, reduction, ignore_index, options, hidden dtype, commit
// mode); not those a retry may change freely (strategy, chunk size,
// determinism, which outputs to return, the version check). Hidden bytes
// are not covered: they arrive after the id is checked.
uint64_t ComputeFingerprint(const v1::ComputeHeader &header);

}  // namespace flce::server

#endif  // FLCE_SERVER_REQUEST_FINGERPRINT_H_
