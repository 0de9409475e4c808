// The accepted ranges of a call's LossOptions (compute_options.h's table), one
// check for the server's header and every engine.
#ifndef FLCE_CORE_LOSS_OPTION_CHECKS_H_
#define FLCE_CORE_LOSS_OPTION_CHECKS_H_

#include <string>

#include "absl/status/status.h"
#include "core/compute_options.h"

namespace flce {

// INVALID_ARGUMENT naming the first option outside its range, e.g.
// "options.temperature = 0 is outside [0.001, 1000]".
absl::Status CheckLossOptions(const LossOptions& options);

// "[lo, hi]", with " or 0 (off)" where 0 is accepted too: the range as the
// messages and the CLI's help spell it.
std::string LossOptionRange(const LossOptionField& field);

}  // namespace flce

#endif  // FLCE_CORE_LOSS_OPTION_CHECKS_H_
