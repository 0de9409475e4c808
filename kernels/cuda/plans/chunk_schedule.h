// Where the chunks of a streamed chunked call end. A call whose rows arrive
// over the wire (Plan::edge_tokens > 0) starts and ends with small chunks,
// so the GPU starts on the first rows early and the last grad_input leaves
// soon after the last rows came, and doubles towards the plan's chunk
// between them, where larger GEMMs read and write the fp32 grad_W fewer
// times. Every other call has chunks of plan.chunk_tokens.
#ifndef FLCE_KERNELS_CUDA_PLANS_CHUNK_SCHEDULE_H_
#define FLCE_KERNELS_CUDA_PLANS_CHUNK_SCHEDULE_H_

#include <cstdint>
#include <vector>

#include "kernels/cuda/plans/plans.h"

namespace flce::cuda {

// The end offsets of the chunks of a call of num_tokens rows, ascending; the
// last is num_tokens. No chunk is larger than plan.chunk_tokens.
std::vector<int64_t> ChunkEnds(const Plan& plan, int64_t num_tokens);

// The rows the chunk that starts at `begin` may take: up to the first end in
// `ends` above begin (a chunk that starts after a gap in the rows ends where
// the schedule's chunk would), at most plan.chunk_tokens.
int64_t ChunkRowsFrom(const std::vector<int64_t>& ends, int64_t chunk_tokens, int64_t begin);

}  // namespace flce::cuda

#endif  // FLCE_KERNELS_CUDA_PLANS_CHUNK_SCHEDULE_H_
