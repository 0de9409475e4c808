// What both preference calls (the two-pass one and the pipelined one) ask of
// the engine: the caller's spec cut to a token range, the forward-only spec of
// a log-prob pass, and which tokens count in a sequence's log-prob.
#ifndef FLCE_KERNELS_PREFERENCE_PASSES_H_
#define FLCE_KERNELS_PREFERENCE_PASSES_H_

#include <cstdint>
#include <vector>

#include "kernels/engine.h"

namespace flce {

// The caller's spec over tokens [begin, end), without the objective and
// without token weights (the objective supplies them).
ComputeSpec SliceSpec(const ComputeSpec& spec, int64_t begin, int64_t end);

// The first pass over tokens [begin, end): forward only, the log-probs alone.
ComputeSpec LogProbPassSpec(const ComputeSpec& spec, int64_t begin, int64_t end);

// Per token, 1 where its target is not ignore_index: the tokens a sequence's
// log-prob sums (and the length SimPO and ORPO normalise by).
std::vector<uint8_t> CountedTokens(const ComputeSpec& spec);

}  // namespace flce

#endif  // FLCE_KERNELS_PREFERENCE_PASSES_H_
