#include "client/cli/compute_policy.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/cli/command.h"
#include "client/cli/tensor_files.h"
#include "core/status_macros.h"

namespace flce::cli {

void DeclarePolicyFlags(FlagSet& flags) {
  flags.Choice("policy", {"", "ppo_clip", "cispo"}, "",
               "a policy objective instead of the cross-entropy (docs/MATH.md): ppo_clip "
               "(PPO/GRPO/DAPO) or cispo; needs --old-logp and --advantages");
  flags.String("old-logp", "the behaviour policy's log-probs, '<f4' .npy, one per token");
  flags.String("advantages", "'<f4' .npy: one per token, or one per sequence of --sequence-ids");
  flags.String("ref-logp",
               "the reference policy's log-probs, '<f4' .npy: one per token (--policy with "
               "--kl-coef, --preference), or one per sequence (--preference)");
  flags.String("sequence-ids", "'<i4'/'<i8' .npy, one per token, nondecreasing");
  flags.String("mask", "'<i4'/'<i8' .npy of 0 and 1, one per token: 0 = does not count");
  flags.Double("clip-low", "epsilon_low: the ratio's lower bound is 1 - it", "0.2");
  flags.Double("clip-high", "epsilon_high: the ratio's upper bound is 1 + it", "0.2");
  flags.Double("dual-clip", "c > 1 bounds -A r by -c A where A < 0; 0 = none", "0");
  flags.Double("kl-coef", "beta of the KL to --ref-logp; 0 = none", "0");
  flags.Choice("kl-estimator", {"k3", "k1"}, "k3", "the KL estimate per token");
  flags.Choice("aggregation", {"token_mean", "seq_mean_token_sum", "seq_mean_token_mean"},
               "token_mean", "how the per-token losses become the loss");
  flags.Double("normalizer", "> 0: divides instead of this call's token, sequence or pair count",
               "0");
  flags.Double("log-ratio-clamp", "logp - old_logp clamped to +- this before exp", "20");
}

absl::Status FillPolicy(const FlagSet& flags, int64_t tokens, v1::ComputeHeader* header) {
  const std::string loss = flags.str("policy");
  if (loss.empty()) {
    for (const char* name : {"old-logp", "advantages", "sequence-ids", "mask"}) {
      if (flags.has(name)) {
        return UsageError("compute", absl::StrCat("--", name, " belongs to --policy"));
      }
    }
    // The reference log-probs and the normalizer also serve --preference.
    if (flags.str("preference").empty()) {
      for (const char* name : {"ref-logp", "normalizer"}) {
        if (flags.has(name)) {
          return UsageError("compute",
                            absl::StrCat("--", name, " belongs to --policy or --preference"));
        }
      }
    }
    return absl::OkStatus();
  }
  if (!flags.has("old-logp") || !flags.has("advantages")) {
    return UsageError("compute", "--policy needs --old-logp and --advantages");
  }
  v1::PolicyObjective* p = header->mutable_policy();
  p->set_loss(loss == "cispo" ? v1::POLICY_LOSS_CISPO : v1::POLICY_LOSS_PPO_CLIP);
  p->set_clip_low(static_cast<float>(flags.f64("clip-low")));
  p->set_clip_high(static_cast<float>(flags.f64("clip-high")));
  p->set_dual_clip(static_cast<float>(flags.f64("dual-clip")));
  p->set_kl_coef(static_cast<float>(flags.f64("kl-coef")));
  p->set_kl_estimator(flags.str("kl-estimator") == "k1" ? v1::KL_ESTIMATOR_K1
                                                        : v1::KL_ESTIMATOR_K3);
  const std::string aggregation = flags.str("aggregation");
  p->set_aggregation(aggregation == "seq_mean_token_sum" ? v1::LOSS_AGGREGATION_SEQ_MEAN_TOKEN_SUM
                     : aggregation == "seq_mean_token_mean"
                         ? v1::LOSS_AGGREGATION_SEQ_MEAN_TOKEN_MEAN
                         : v1::LOSS_AGGREGATION_TOKEN_MEAN);
  p->set_normalizer(flags.f64("normalizer"));
  p->set_log_ratio_clamp(static_cast<float>(flags.f64("log-ratio-clamp")));
  FLCE_ASSIGN_OR_RETURN(std::vector<float> old_logp, ReadFloat32(flags.str("old-logp"), tokens));
  p->set_old_logp(ArrayBytes(old_logp));
  if (flags.has("ref-logp")) {
    FLCE_ASSIGN_OR_RETURN(std::vector<float> ref, ReadFloat32(flags.str("ref-logp"), tokens));
    p->set_ref_logp(ArrayBytes(ref));
  }
  int64_t sequences = 1;
  if (flags.has("sequence-ids")) {
    FLCE_ASSIGN_OR_RETURN(std::vector<int32_t> ids,
                          ReadInt32PerToken("sequence-ids", flags.str("sequence-ids"), tokens));
    for (size_t t = 1; t < ids.size(); ++t) sequences += ids[t] != ids[t - 1];
    p->set_sequence_ids(ArrayBytes(ids));
  }
  if (flags.has("mask")) {
    FLCE_ASSIGN_OR_RETURN(std::vector<int32_t> mask,
                          ReadInt32PerToken("mask", flags.str("mask"), tokens));
    std::vector<uint8_t> bytes(mask.size());
    for (size_t t = 0; t < mask.size(); ++t) {
      if (mask[t] != 0 && mask[t] != 1) {
        return absl::InvalidArgumentError(absl::StrCat("--mask ", flags.str("mask"), ": entry ", t,
                                                       " is ", mask[t], ", not 0 or 1"));
      }
      bytes[t] = static_cast<uint8_t>(mask[t]);
    }
    p->set_mask(ArrayBytes(bytes));
  }
  // One per token, or (with sequence ids) one per sequence.
  absl::StatusOr<std::vector<float>> advantages = ReadFloat32(flags.str("advantages"), tokens);
  if (!advantages.ok() && flags.has("sequence-ids") && sequences != tokens) {
    advantages = ReadFloat32(flags.str("advantages"), sequences);
    if (!advantages.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--advantages ", flags.str("advantages"), " must hold ", tokens,
                       " entries (one per token) or ", sequences,
                       " (one per sequence): ", advantages.status().message()));
    }
  }
  if (!advantages.ok()) return advantages.status();
  p->set_advantages(ArrayBytes(*advantages));
  return absl::OkStatus();
}

}  // namespace flce::cli
