// 64-bit fingerprints of what a Compute call computes, so that a request id
// reused for other data is refused instead of being answered as a replay.
//
// Usage:
//   uint64_t fp = ComputeFingerprint(header);
//   store.BeginContribution(session, header.request_id(), fp, deferred);
//   uint64_t rows_fp = 0;
//   for (chunk : chunks) rows_fp += HiddenFingerprint(chunk.data, rows, row_bytes, offset);
#ifndef FLCE_SERVER_VALIDATE_REQUEST_FINGERPRINT_H_
#define FLCE_SERVER_VALIDATE_REQUEST_FINGERPRINT_H_

#include <cstdint>

#include "flce/v1/flce.pb.h"

namespace flce::server {

// Covers the fields that define the call's loss and gradients (head, targets,
// per-token weights, reduction, ignore_index, options, hidden dtype, commit
// mode); not those a retry may change freely (strategy, chunk size,
// determinism, which outputs to return, the version check, the region). Hidden bytes
// are covered by HiddenFingerprint: they arrive after the id is checked.
uint64_t ComputeFingerprint(const v1::ComputeHeader &header);

// The same for an EmbedGrad call: its head, session, token ids, row dtype
// and padding_idx (not its determinism or version check).
uint64_t EmbedGradFingerprint(const v1::EmbedGradHeader &header);

// The sum (mod 2^64) over `rows` rows of XXH3(row bytes, seed = its token
// index). Summing per-row hashes keyed by the token index makes the total
// independent of chunking and arrival order, yet moving a row changes it.
uint64_t HiddenFingerprint(const void *data, int64_t rows, int64_t row_bytes, int64_t first_token);

}  // namespace flce::server

#endif  // FLCE_SERVER_VALIDATE_REQUEST_FINGERPRINT_H_
