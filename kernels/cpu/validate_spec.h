// Checks a ComputeSpec against the head it runs on before any work starts,
// so that bad input fails with INVALID_ARGUMENT naming the field (and the
// first bad token) instead of producing numbers.
#ifndef FLCE_KERNELS_CPU_VALIDATE_SPEC_H_
#define FLCE_KERNELS_CPU_VALIDATE_SPEC_H_

#include "absl/status/status.h"
#include "kernels/engine.h"

namespace flce::cpu {

absl::Status ValidateComputeSpec(const HeadSpec& head, const ComputeSpec& spec);

}  // namespace flce::cpu

#endif  // FLCE_KERNELS_CPU_VALIDATE_SPEC_H_
