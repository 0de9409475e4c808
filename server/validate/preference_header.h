// ComputeHeader.preference into the engines' PreferenceObjective: the wire's
// arrays decoded with their own checks (sizes in bytes, enum values) and a
// per-token reference summed per sequence. The engines' spec check
// (ValidatePreferenceObjective) runs on the result with the rest of the spec.
#ifndef FLCE_SERVER_VALIDATE_PREFERENCE_HEADER_H_
#define FLCE_SERVER_VALIDATE_PREFERENCE_HEADER_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "core/preference_objective.h"
#include "flce/v1/flce.pb.h"

namespace flce::server {

// `targets` and `ignore_index` as decoded from the same header.
absl::StatusOr<PreferenceObjective> PreferenceFromHeader(const v1::PreferenceObjective& preference,
                                                         const std::vector<int32_t>& targets,
                                                         int32_t ignore_index);

}  // namespace flce::server

#endif  // FLCE_SERVER_VALIDATE_PREFERENCE_HEADER_H_
