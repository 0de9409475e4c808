// The Compute target: each call of an input (FuzzInput records, split at empty
// records) runs through a real ComputeJob over a FakeComputeChannel, and
// afterwards what must hold whatever the bytes were is checked:
//   - the job returns a status; a client's bytes never produce INTERNAL,
//     UNKNOWN or DATA_LOSS; an error says what went wrong;
//   - the summary is sent exactly when the call succeeds, and last;
//   - grad_input and token outputs lie inside [0, num_tokens), never overlap,
//     have the sizes their token counts say, and cover every token on success;
//   - a failed call changes no session's grad_W, a successful one no other
//     session's; every grad_W (and grad_b) stays finite, after Commit too;
//   - no call is left counted in flight.
// Flags bits 2-7: 2 the stream ends in a cancellation instead of a
// half-close, 3 WaitForSent finds the client gone, 4-5 the k-th WaitForRoom
// does, 6 the caller is tenant "t1" instead of the anonymous admin, 7 staged
// contributions are discarded instead of committed.
#ifndef FLCE_TESTS_FUZZ_COMPUTE_JOB_TARGET_H_
#define FLCE_TESTS_FUZZ_COMPUTE_JOB_TARGET_H_

#include "tests/fuzz/fuzz_input.h"

namespace flce::fuzz {

void RunComputeJobs(const FuzzInput& input);

}  // namespace flce::fuzz

#endif  // FLCE_TESTS_FUZZ_COMPUTE_JOB_TARGET_H_
