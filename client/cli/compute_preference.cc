#include "client/cli/compute_preference.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/cli/command.h"
#include "client/cli/tensor_files.h"
#include "core/status_macros.h"

namespace flce::cli {
namespace {

v1::PreferenceLoss PreferenceLossOf(const std::string& name) {
  if (name == "ipo") return v1::PREFERENCE_LOSS_IPO;
  if (name == "dpo_hinge") return v1::PREFERENCE_LOSS_DPO_HINGE;
  if (name == "simpo") return v1::PREFERENCE_LOSS_SIMPO;
  if (name == "orpo") return v1::PREFERENCE_LOSS_ORPO;
  return v1::PREFERENCE_LOSS_DPO_SIGMOID;
}

}  // namespace

void DeclarePreferenceFlags(FlagSet& flags) {
  flags.Choice("preference", {"", "dpo_sigmoid", "ipo", "dpo_hinge", "simpo", "orpo"}, "",
               "a preference objective over pairs instead of the cross-entropy (docs/MATH.md); "
               "needs --sequence-of-token, and --ref-logp for dpo_sigmoid, ipo and dpo_hinge");
  flags.String("sequence-of-token",
               "'<i4'/'<i8' .npy, one per token: its sequence, 2p = pair p's chosen response, "
               "2p + 1 its rejected one, -1 = none (prompt, padding)");
  flags.Int("pairs", "the call's pairs P; default: from the highest sequence id");
  flags.Double("beta", "the objective's beta (ORPO's lambda) in (0, 1000]; default 0.1");
  flags.Double("gamma", "simpo's target margin in [0, 100]", "0");
  flags.Double("dpo-label-smoothing", "dpo_sigmoid's label smoothing in [0, 0.5)", "0");
}

absl::Status FillPreference(const FlagSet& flags, int64_t tokens, v1::ComputeHeader* header) {
  const std::string loss = flags.str("preference");
  if (loss.empty()) {
    for (const char* name :
         {"sequence-of-token", "pairs", "beta", "gamma", "dpo-label-smoothing"}) {
      if (flags.has(name)) {
        return UsageError("compute", absl::StrCat("--", name, " belongs to --preference"));
      }
    }
    return absl::OkStatus();
  }
  if (!flags.str("policy").empty()) {
    return UsageError("compute", "--preference and --policy are two objectives: give one");
  }
  if (!flags.has("sequence-of-token")) {
    return UsageError("compute", "--preference needs --sequence-of-token");
  }
  FLCE_ASSIGN_OR_RETURN(
      std::vector<int32_t> sequence,
      ReadInt32PerToken("sequence-of-token", flags.str("sequence-of-token"), tokens));
  const int32_t highest =
      sequence.empty() ? -1 : *std::max_element(sequence.begin(), sequence.end());
  const int64_t pairs = flags.has("pairs") ? flags.i64("pairs") : highest / 2 + 1;
  if (pairs < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--sequence-of-token ",
                                                   flags.str("sequence-of-token"),
                                                   " names no sequence (every entry is -1)"));
  }
  v1::PreferenceObjective* p = header->mutable_preference();
  p->set_loss(PreferenceLossOf(loss));
  if (flags.has("beta")) p->set_beta(static_cast<float>(flags.f64("beta")));
  p->set_gamma(static_cast<float>(flags.f64("gamma")));
  p->set_label_smoothing(static_cast<float>(flags.f64("dpo-label-smoothing")));
  p->set_num_pairs(static_cast<int32_t>(pairs));
  p->set_sequence_of_token(ArrayBytes(sequence));
  p->set_normalizer(flags.f64("normalizer"));
  if (flags.has("ref-logp")) {
    // One per token, else one per sequence (2P): the server sums a per-token
    // file over each sequence's counted tokens.
    absl::StatusOr<std::vector<float>> ref = ReadFloat32(flags.str("ref-logp"), tokens);
    if (ref.ok()) {
      p->set_ref_token_logp(ArrayBytes(*ref));
    } else {
      ref = ReadFloat32(flags.str("ref-logp"), 2 * pairs);
      if (!ref.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("--ref-logp ", flags.str("ref-logp"), " must hold ", tokens,
                         " entries (one per token) or ", 2 * pairs,
                         " (one per sequence): ", ref.status().message()));
      }
      p->set_ref_logp(ArrayBytes(*ref));
    }
  }
  return absl::OkStatus();
}

}  // namespace flce::cli
