#include "server/handlers/head_info.h"

#include "server/validate/validation.h"

namespace flce::server {

void FillHeadInfo(const HeadEntry& entry, int64_t sessions, v1::HeadInfo* out) {
  const HeadSpec& spec = entry.head->spec();
  out->set_head_id(entry.head_id);
  out->set_vocab_size(spec.vocab_size);
  out->set_hidden_size(spec.hidden_size);
  out->set_dtype(DTypeToProto(spec.dtype));
  out->set_has_bias(spec.has_bias);
  out->set_version(entry.version);
  out->set_weight_bytes(HeadBytes(spec));
  out->set_source(entry.source);
  out->set_sessions(sessions);
  if (entry.training != nullptr) entry.training->Describe(out->mutable_optimizer());
  if (out->optimizer().kind() == v1::OPTIMIZER_UNSPECIFIED) out->clear_optimizer();
}

void FillSessionInfo(const SessionSummary& summary, v1::SessionInfo* out) {
  out->set_head_id(summary.head_id);
  out->set_session_id(summary.session_id);
  out->set_contributions(summary.contributions);
  out->set_pending(summary.pending);
  out->set_tokens(summary.tokens);
  out->set_idle_seconds(summary.idle_seconds);
  out->set_grad_bytes(summary.grad_bytes);
  out->mutable_computed_on()->set_oldest(summary.computed_on.oldest);
  out->mutable_computed_on()->set_newest(summary.computed_on.newest);
}

v1::ContributionState ToProto(ContributionState state) {
  switch (state) {
    case ContributionState::kInFlight:
      return v1::CONTRIBUTION_UNKNOWN;
    case ContributionState::kStaged:
      return v1::CONTRIBUTION_STAGED;
    case ContributionState::kCommitted:
      return v1::CONTRIBUTION_COMMITTED;
    case ContributionState::kDiscarded:
      return v1::CONTRIBUTION_DISCARDED;
  }
  return v1::CONTRIBUTION_UNKNOWN;
}

}  // namespace flce::server
