// ComputeHeader.policy into the engines' PolicyObjective: the wire's
// per-sequence form (mask, sequence ids, per-sequence advantages, the
// aggregation) resolved to per-token inputs and weights, with the wire's own
// checks (sizes in bytes, enum values). The engines' spec check
// (ValidatePolicyObjective) runs on the result with the rest of the spec.
#ifndef FLCE_SERVER_VALIDATE_POLICY_HEADER_H_
#define FLCE_SERVER_VALIDATE_POLICY_HEADER_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "core/policy_objective.h"
#include "flce/v1/flce.pb.h"

namespace flce::server {

// `targets` and `ignore_index` as decoded from the same header.
absl::StatusOr<PolicyObjective> PolicyFromHeader(const v1::PolicyObjective& policy,
                                                 const std::vector<int32_t>& targets,
                                                 int32_t ignore_index);

}  // namespace flce::server

#endif  // FLCE_SERVER_VALIDATE_POLICY_HEADER_H_
