#include "core/loss_option_checks.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace flce {

std::string LossOptionRange(const LossOptionField& field) {
  std::string range = absl::StrCat("[", field.lo, ", ", field.hi, "]");
  if (field.zero_is_off) absl::StrAppend(&range, " or 0 (off)");
  return range;
}

absl::Status CheckLossOptions(const LossOptions& options) {
  for (const LossOptionField& field : kLossOptionFields) {
    const float value = options.*field.member;
    if (field.zero_is_off && value == 0.0f) continue;
    if (std::isfinite(value) && value >= field.lo && value <= field.hi) continue;
    return absl::InvalidArgumentError(absl::StrCat("options.", field.name, " = ", value,
                                                   " is outside ", LossOptionRange(field)));
  }
  return absl::OkStatus();
}

}  // namespace flce
