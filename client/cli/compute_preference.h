// compute's preference-objective flags (--preference and its inputs):
// ComputeHeader.preference from .npy files.
#ifndef FLCE_CLIENT_CLI_COMPUTE_PREFERENCE_H_
#define FLCE_CLIENT_CLI_COMPUTE_PREFERENCE_H_

#include <cstdint>

#include "absl/status/status.h"
#include "client/cli/flags.h"
#include "flce/v1/flce.pb.h"

namespace flce::cli {

// Declares --preference, --sequence-of-token, --pairs, --beta, --gamma and
// --dpo-label-smoothing; --ref-logp and --normalizer are the policy flags'.
void DeclarePreferenceFlags(FlagSet& flags);

// Fills header->preference when --preference is given (else leaves it unset
// and refuses its flags); --sequence-of-token must hold `tokens` entries,
// --ref-logp one per token or one per sequence.
absl::Status FillPreference(const FlagSet& flags, int64_t tokens, v1::ComputeHeader* header);

}  // namespace flce::cli

#endif  // FLCE_CLIENT_CLI_COMPUTE_PREFERENCE_H_
