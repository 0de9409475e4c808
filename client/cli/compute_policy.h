// compute's policy-objective flags (--policy and its inputs): ComputeHeader.policy
// from .npy files.
#ifndef FLCE_CLIENT_CLI_COMPUTE_POLICY_H_
#define FLCE_CLIENT_CLI_COMPUTE_POLICY_H_

#include <cstdint>

#include "absl/status/status.h"
#include "client/cli/flags.h"
#include "flce/v1/flce.pb.h"

namespace flce::cli {

void DeclarePolicyFlags(FlagSet& flags);

// Fills header->policy when --policy is given (else leaves it unset); the
// per-token files must hold `tokens` entries (advantages: or one per sequence).
absl::Status FillPolicy(const FlagSet& flags, int64_t tokens, v1::ComputeHeader* header);

}  // namespace flce::cli

#endif  // FLCE_CLIENT_CLI_COMPUTE_POLICY_H_
