// The validation functions on their own, against what they promise:
//   ComputeSpecFromHeader: each record parsed as a ComputeRequest, its header
//     checked against every fuzz head; an accepted spec holds only values the
//     engine may be given (token count within the limit, targets in [0, V) or
//     ignore_index, finite options in range, per-token weights sized and
//     finite), and a refusal is INVALID_ARGUMENT or RESOURCE_EXHAUSTED.
//     The ids go through ValidateId, each record also through
//     HeadSpecFromUpload as an UploadHeadHeader.
//   RowTracker: a sequence of chunks (any offsets and sizes, int64
//     extremes included) accepted exactly when a plain bitmap model says so,
//     with the same counts and the same first missing row.
#ifndef FLCE_TESTS_FUZZ_VALIDATION_TARGETS_H_
#define FLCE_TESTS_FUZZ_VALIDATION_TARGETS_H_

#include "tests/fuzz/fuzz_input.h"

namespace flce::fuzz {

void RunComputeSpecChecks(const FuzzInput& input);
void RunRowTrackerChecks(const FuzzInput& input);

}  // namespace flce::fuzz

#endif  // FLCE_TESTS_FUZZ_VALIDATION_TARGETS_H_
