#include "kernels/engine.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/loss_option_checks.h"
#include "core/status_macros.h"
#include "kernels/held_rows.h"
#include "kernels/preference_call.h"
#include "kernels/preference_passes.h"
#include "kernels/preference_pipelined_call.h"

namespace flce {

absl::Status CheckRowIds(const int32_t* ids, int64_t n, int64_t vocab_size) {
  for (int64_t i = 0; i < n; ++i) {
    if (ids[i] < 0 || ids[i] >= vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("token id ", ids[i], " at index ", i, " is outside [0, ", vocab_size, ")"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<PeerRows> ComputeCall::AddHiddenFromPeer(int64_t, int64_t, const PeerMemory&,
                                                         int64_t) {
  return absl::FailedPreconditionError(
      "this engine cannot read hidden states from another process's device memory (CUDA IPC "
      "needs the CUDA engine)");
}

absl::StatusOr<std::shared_ptr<const PeerMemory>> Engine::OpenPeerMemory(const PeerMemoryHandle&) {
  return absl::FailedPreconditionError(absl::StrCat(
      "the ", info().name,
      " engine cannot open another process's device memory (CUDA IPC needs the CUDA engine)"));
}

absl::Status Engine::ReadPeerMemory(const PeerMemory&, int64_t, int64_t, void*) {
  return absl::FailedPreconditionError(
      absl::StrCat("the ", info().name, " engine has no peer memory to read"));
}

int64_t Engine::PlannedChunkTokens(const Head&, const ComputeSpec&) const { return 0; }

absl::StatusOr<std::shared_ptr<const PeerMemory>> Engine::RegisterHostMemory(void*, int64_t) {
  return absl::FailedPreconditionError(
      absl::StrCat("the ", info().name, " engine has no GPU to page-lock host memory for"));
}

namespace {

absl::Status CheckPerTokenWeights(const char* name, const std::vector<float>& weights,
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
          absl::StrCat(name, "[", t, "] = ", weights[t], " is not finite"));
    }
  }
  return absl::OkStatus();
}

// An objective replaces the cross-entropy's loss, so the terms added to that
// loss (core's kRowScale and kRowTerm options) have nothing to add to.
absl::Status CheckNoLossTerm(const LossOptions& options, const char* objective) {
  for (LossOptionKind kind : {LossOptionKind::kRowScale, LossOptionKind::kRowTerm}) {
    if (const LossOptionField* on = FirstOptionOfKindOn(options, kind)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "options.", on->name, " = ", options.*on->member, " must be off with ", objective));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateComputeSpec(const HeadSpec& head, const ComputeSpec& spec) {
  const int64_t n = spec.num_tokens;
  if (n < 0) {
    return absl::InvalidArgumentError(absl::StrCat("num_tokens = ", n, " is negative"));
  }
  if (static_cast<int64_t>(spec.targets.size()) != n) {
    return absl::InvalidArgumentError(absl::StrCat("targets has ", spec.targets.size(),
                                                   " entries, expected num_tokens = ", n));
  }
  for (int64_t t = 0; t < n; ++t) {
    const int32_t y = spec.targets[t];
    if (y != spec.ignore_index && (y < 0 || y >= head.vocab_size)) {
      return absl::InvalidArgumentError(absl::StrCat("targets[", t, "] = ", y, " is outside [0, ",
                                                     head.vocab_size, ") and is not ignore_index (",
                                                     spec.ignore_index, ")"));
    }
  }
  if (spec.chunk_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk_tokens = ", spec.chunk_tokens, " is negative"));
  }
  const LossOptions& o = spec.options;
  FLCE_RETURN_IF_ERROR(CheckLossOptions(o));
  absl::Status weights = CheckPerTokenWeights("token_weights", spec.token_weights, n);
  if (!weights.ok()) return weights;
  weights = CheckPerTokenWeights("entropy_weights", spec.entropy_weights, n);
  if (!weights.ok()) return weights;
  if (spec.policy.has_value()) {
    // The objective replaces the cross-entropy's a_t: what shapes it alone.
    if (!spec.token_weights.empty()) {
      return absl::InvalidArgumentError(
          "token_weights do not combine with a policy objective (its aggregation weighs the "
          "tokens)");
    }
    FLCE_RETURN_IF_ERROR(
        CheckNoLossTerm(o, "a policy objective (its loss is a function of the log-prob alone)"));
    FLCE_RETURN_IF_ERROR(ValidatePolicyObjective(*spec.policy, n));
  }
  if (spec.preference.has_value()) {
    if (spec.policy.has_value()) {
      return absl::InvalidArgumentError(
          "a call carries a policy objective or a preference objective, not both");
    }
    if (!spec.token_weights.empty()) {
      return absl::InvalidArgumentError(
          "token_weights do not combine with a preference objective (it weighs the tokens)");
    }
    FLCE_RETURN_IF_ERROR(CheckNoLossTerm(
        o, "a preference objective (its loss is a function of the log-probs alone)"));
    if (spec.outputs.per_token_loss) {
      return absl::InvalidArgumentError(
          "per_token_loss is not an output of a preference objective (its loss is per pair; "
          "ask for logprob)");
    }
    FLCE_RETURN_IF_ERROR(ValidatePreferenceObjective(*spec.preference, CountedTokens(spec)));
  }
  if (spec.grad_out != nullptr) {
    const GradBuffer& g = *spec.grad_out;
    if (g.vocab_size() != head.vocab_size || g.hidden_size() != head.hidden_size ||
        g.has_bias() != head.has_bias) {
      return absl::InvalidArgumentError(absl::StrCat(
          "grad_out is ", g.vocab_size(), " x ", g.hidden_size(), g.has_bias() ? " + bias" : "",
          ", the head is ", head.vocab_size, " x ", head.hidden_size,
          head.has_bias ? " + bias" : ""));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckHiddenRowRange(int64_t offset, int64_t rows, const std::vector<uint8_t>& given) {
  const int64_t n = static_cast<int64_t>(given.size());
  if (offset < 0 || rows < 0 || offset > n - rows) {
    return absl::InvalidArgumentError(
        absl::StrCat("hidden rows [", offset, ", ", offset + rows, ") outside [0, ", n, ")"));
  }
  for (int64_t t = offset; t < offset + rows; ++t) {
    if (given[t]) {
      return absl::InvalidArgumentError(absl::StrCat("hidden rows [", offset, ", ", offset + rows,
                                                     ") overlap rows already given (token ", t,
                                                     ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status NonFiniteHiddenRow(int64_t offset, int64_t bad, int64_t hidden) {
  return absl::InvalidArgumentError(absl::StrCat("hidden row of token ", offset + bad / hidden,
                                                 " has a non-finite value at column ",
                                                 bad % hidden));
}

int64_t HeldRowsKeptBytes() { return HeldRows::KeptBytes(); }

absl::StatusOr<std::unique_ptr<ComputeCall>> StartComputeCall(Engine& engine,
                                                              std::shared_ptr<const Head> head,
                                                              ComputeSpec spec,
                                                              GradInputSink sink) {
  if (PipelinedPreferenceCall::Suits(spec)) {
    return PipelinedPreferenceCall::Start(engine, std::move(head), std::move(spec),
                                          std::move(sink));
  }
  if (spec.preference.has_value()) {
    return PreferenceComputeCall::Start(engine, std::move(head), std::move(spec),
                                        std::move(sink));
  }
  return engine.StartCompute(std::move(head), std::move(spec), std::move(sink));
}

absl::Status RefuseTwoPassSpec(const ComputeSpec& spec, const char* engine_name) {
  if (!spec.preference.has_value()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "the ", engine_name,
      " engine runs a preference objective's two passes only through StartComputeCall"));
}

}  // namespace flce
