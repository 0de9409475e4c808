#include "kernels/cpu/validate_spec.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace flce::cpu {
namespace {

absl::Status CheckWeights(const char* name, const std::vector<float>& weights,
                          int64_t num_tokens) {
  if (weights.empty()) return absl::OkStatus();
  if (static_cast<int64_t>(weights.size()) != num_tokens) {
    return absl::InvalidArgumentError(absl::StrCat(name, " has ", weights.size(),
                                                   " entries, expected num_tokens = ",
                                                   num_tokens));
  }
  for (size_t t = 0; t < weights.size(); ++t) {
    if (!std::isfinite(weights[t])) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, " of token ", t, " is not finite (", weights[t], ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateComputeSpec(const HeadSpec& head, const ComputeSpec& spec) {
  const int64_t V = head.vocab_size;
  if (spec.num_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_tokens is ", spec.num_tokens, ", must be >= 0"));
  }
  if (static_cast<int64_t>(spec.targets.size()) != spec.num_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("targets has ", spec.targets.size(),
                                                   " entries, expected num_tokens = ",
                                                   spec.num_tokens));
  }
  for (size_t t = 0; t < spec.targets.size(); ++t) {
    const int32_t y = spec.targets[t];
    if (y != spec.ignore_index && (y < 0 || y >= V)) {
      return absl::InvalidArgumentError(absl::StrCat("target of token ", t, " is ", y,
                                                     ", outside [0, ", V,
                                                     ") and not ignore_index (",
                                                     spec.ignore_index, ")"));
    }
  }
  if (spec.chunk_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk_tokens is ", spec.chunk_tokens, ", must be >= 0"));
  }
  const LossOptions& o = spec.options;
  if (!(o.label_smoothing >= 0.0f && o.label_smoothing <= 1.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("label_smoothing is ", o.label_smoothing, ", must be in [0, 1]"));
  }
  if (!(o.z_loss_scale >= 0.0f) || !std::isfinite(o.z_loss_scale)) {
    return absl::InvalidArgumentError(
        absl::StrCat("z_loss_scale is ", o.z_loss_scale, ", must be finite and >= 0"));
  }
  if (!(o.softcap >= 0.0f) || !std::isfinite(o.softcap)) {
    return absl::InvalidArgumentError(
        absl::StrCat("softcap is ", o.softcap, ", must be finite and >= 0 (0 = none)"));
  }
  if (!(o.temperature > 0.0f) || !std::isfinite(o.temperature)) {
    return absl::InvalidArgumentError(
        absl::StrCat("temperature is ", o.temperature, ", must be finite and > 0"));
  }
  if (!std::isfinite(o.grad_scale)) {
    return absl::InvalidArgumentError(
        absl::StrCat("grad_scale is ", o.grad_scale, ", must be finite"));
  }
  absl::Status status = CheckWeights("token_weights", spec.token_weights, spec.num_tokens);
  if (!status.ok()) return status;
  status = CheckWeights("entropy_weights", spec.entropy_weights, spec.num_tokens);
  if (!status.ok()) return status;
  if (spec.grad_out != nullptr) {
    const GradBuffer& g = *spec.grad_out;
    if (g.vocab_size() != V || g.hidden_size() != head.hidden_size ||
        g.has_bias() != head.has_bias) {
      return absl::InvalidArgumentError(absl::StrCat(
          "grad_out is ", g.vocab_size(), " x ", g.hidden_size(), g.has_bias() ? " + bias" : "",
          ", the head is ", V, " x ", head.hidden_size, head.has_bias ? " + bias" : ""));
    }
  }
  return absl::OkStatus();
}

}  // namespace flce::cpu
