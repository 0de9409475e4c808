#include "server/state/session_store.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/status_macros.h"
#include "server/validate/validation.h"

namespace flce::server {
namespace {

std::string Describe(const std::string& head_id, const std::string& session_id) {
  return absl::StrCat("session \"", session_id, "\" of head \"", head_id, "\"");
}

// The request's outcome moved to `state`, its fingerprints kept.
Outcome WithState(const OutcomeLog& log, const std::string& request_id, ContributionState state,
                  float scale) {
  const Outcome* first = log.Find(request_id);
  Outcome out;
  out.state = state;
  out.scale = scale;
  if (first != nullptr) {
    out.fingerprint = first->fingerprint;
    out.hidden_fingerprint = first->hidden_fingerprint;
    out.hidden_on_device = first->hidden_on_device;
  }
  return out;
}

// INVALID_ARGUMENT for a gradient that must not land, or OK.
absl::Status NonFiniteGrad(const FiniteCheck& check, const std::string& where,
                           const char* contribution) {
  if (!check.contribution_finite) {
    return absl::InvalidArgumentError(absl::StrCat(kNonFiniteResult, "grad_W: ", contribution,
                                                   " holds NaN or Inf; nothing landed in ", where));
  }
  if (!check.sum_finite) {
    return absl::InvalidArgumentError(
        absl::StrCat(kNonFiniteResult, "grad_W: ", contribution,
                     " is finite but its sum with the accumulator of ", where,
                     " overflows fp32; nothing landed (the accumulator is unchanged)"));
  }
  return absl::OkStatus();
}

}  // namespace

void VersionRange::Add(uint64_t version) {
  if (oldest == 0 || version < oldest) oldest = version;
  if (version > newest) newest = version;
}

const Outcome* OutcomeLog::Find(const std::string& request_id) const {
  auto it = outcomes_.find(request_id);
  return it == outcomes_.end() ? nullptr : &it->second;
}

void OutcomeLog::Set(const std::string& request_id, Outcome outcome) {
  auto [it, inserted] = outcomes_.insert_or_assign(request_id, outcome);
  if (!inserted) return;
  order_.push_back(request_id);
  // Forget the oldest finished outcomes; in-flight and staged ones are still
  // needed (and bounded by --max-pending).
  for (auto o = order_.begin(); outcomes_.size() > capacity_ && o != order_.end();) {
    auto found = outcomes_.find(*o);
    if (found == outcomes_.end()) {
      o = order_.erase(o);
    } else if (found->second.state == ContributionState::kCommitted ||
               found->second.state == ContributionState::kDiscarded) {
      outcomes_.erase(found);
      o = order_.erase(o);
    } else {
      ++o;
    }
  }
}

void OutcomeLog::Erase(const std::string& request_id) {
  outcomes_.erase(request_id);
  auto it = std::find(order_.begin(), order_.end(), request_id);
  if (it != order_.end()) order_.erase(it);
}

Session::Session(std::string tenant, std::string head_id, std::string session_id, HeadSpec spec,
                 std::unique_ptr<GradBuffer> grad, size_t outcome_capacity)
    : tenant_(std::move(tenant)),
      head_id_(std::move(head_id)),
      session_id_(std::move(session_id)),
      spec_(spec),
      grad_(std::move(grad)),
      outcomes_(outcome_capacity),
      last_used_(absl::Now()) {}

SessionStore::SessionStore(Engine* engine, SessionLimits limits)
    : engine_(engine), limits_(limits) {}

absl::StatusOr<std::shared_ptr<Session>> SessionStore::GetOrCreate(const std::string& tenant,
                                                                   const std::string& head_id,
                                                                   const std::string& session_id,
                                                                   const HeadSpec& spec) {
  {
    absl::MutexLock lock(&mu_);
    auto it = sessions_.find({tenant, head_id, session_id});
    if (it != sessions_.end()) {
      const HeadSpec& have = it->second->spec();
      if (have.vocab_size != spec.vocab_size || have.hidden_size != spec.hidden_size ||
          have.has_bias != spec.has_bias) {
        return absl::FailedPreconditionError(
            absl::StrCat(Describe(head_id, session_id), " holds a ", have.vocab_size, " x ",
                         have.hidden_size, " gradient; the head is now ", spec.vocab_size, " x ",
                         spec.hidden_size, ": delete the session first"));
      }
      return it->second;
    }
    if (static_cast<int64_t>(sessions_.size()) >= limits_.max_sessions) {
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot create ", Describe(head_id, session_id), ": ", sessions_.size(),
                       " sessions exist, --max-sessions=", limits_.max_sessions));
    }
  }
  // Allocating (and zeroing) V x H fp32 takes a while: not under the lock.
  FLCE_ASSIGN_OR_RETURN(std::unique_ptr<GradBuffer> grad, engine_->NewGradBuffer(spec));
  auto session = std::make_shared<Session>(tenant, head_id, session_id, spec, std::move(grad),
                                           limits_.outcome_log);
  absl::MutexLock lock(&mu_);
  auto [it, inserted] = sessions_.emplace(Key{tenant, head_id, session_id}, session);
  if (inserted) {
    if (static_cast<int64_t>(sessions_.size()) > limits_.max_sessions) {
      sessions_.erase(it);
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot create ", Describe(head_id, session_id),
                       ": --max-sessions=", limits_.max_sessions, " reached"));
    }
  }
  return it->second;  // another call may have created it meanwhile
}

absl::StatusOr<std::shared_ptr<Session>> SessionStore::Find(const std::string& tenant,
                                                            const std::string& head_id,
                                                            const std::string& session_id) const {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find({tenant, head_id, session_id});
  if (it == sessions_.end()) {
    return absl::NotFoundError(absl::StrCat(Describe(head_id, session_id), " does not exist"));
  }
  return it->second;
}

absl::StatusOr<BeginResult> SessionStore::BeginContribution(Session& session,
                                                            const std::string& request_id,
                                                            uint64_t fingerprint, bool deferred) {
  absl::MutexLock lock(&session.mu_);
  if (session.deleted_) {
    return absl::AbortedError(
        absl::StrCat(Describe(session.head_id_, session.session_id_), " was just deleted"));
  }
  session.last_used_ = absl::Now();
  BeginResult result;
  if (const Outcome* first = session.outcomes_.Find(request_id); first != nullptr) {
    if (first->state == ContributionState::kInFlight) {
      return absl::AbortedError(absl::StrCat("request_id \"", request_id,
                                             "\" is still in flight in ",
                                             Describe(session.head_id_, session.session_id_)));
    }
    if (first->fingerprint != fingerprint) {
      return absl::InvalidArgumentError(
          absl::StrCat("request id \"", request_id,
                       "\" was used for a different request (other targets, weights or "
                       "options) in ",
                       Describe(session.head_id_, session.session_id_),
                       ": choose a new request id for new data"));
    }
    result.replay = true;
    result.first = *first;
    return result;
  }
  if (deferred) {
    const int64_t pending =
        session.in_flight_deferred_ + static_cast<int64_t>(session.staged_.size());
    if (pending >= limits_.max_pending) {
      return absl::ResourceExhaustedError(absl::StrCat(
          Describe(session.head_id_, session.session_id_), " already has ", pending,
          " deferred contributions (staged for Commit or still computing), --max-pending=",
          limits_.max_pending, ": commit or discard some first"));
    }
    ++session.in_flight_deferred_;
  }
  ++session.in_flight_;
  Outcome outcome;
  outcome.fingerprint = fingerprint;
  session.outcomes_.Set(request_id, outcome);
  return result;
}

absl::Status SessionStore::CompleteContribution(Session& session, const std::string& request_id,
                                                StagedGrad staged, bool deferred, int64_t tokens,
                                                uint64_t hidden_fingerprint,
                                                bool hidden_on_device) {
  const std::string where = Describe(session.head_id_, session.session_id_);
  absl::Status refused;
  if (deferred) {
    // A staged contribution must be finite already: checked outside the lock,
    // the buffer is still private to this call.
    absl::StatusOr<bool> finite = staged.grad->AllFinite();
    if (!finite.ok()) {
      refused = finite.status();
    } else if (!*finite) {
      refused = NonFiniteGrad(FiniteCheck{false, true}, where, "this call's contribution");
    }
  }
  absl::MutexLock lock(&session.mu_);
  --session.in_flight_;
  if (deferred) --session.in_flight_deferred_;
  session.last_used_ = absl::Now();
  if (session.deleted_) {
    session.outcomes_.Erase(request_id);
    return absl::AbortedError(absl::StrCat(where, " was deleted while the call ran"));
  }
  if (!refused.ok()) {
    session.outcomes_.Erase(request_id);
    return refused;
  }
  if (deferred) {
    session.staged_[request_id] = std::move(staged);
    Outcome outcome = WithState(session.outcomes_, request_id, ContributionState::kStaged, 0.0f);
    outcome.hidden_fingerprint = hidden_fingerprint;
    outcome.hidden_on_device = hidden_on_device;
    session.outcomes_.Set(request_id, outcome);
  } else {
    // staging = grad + staging, checked in the same pass; then the two swap,
    // and the old accumulator goes with the call's reservation.
    absl::StatusOr<FiniteCheck> check = staged.grad->ScaleAndAdd(1.0f, *session.grad_);
    absl::Status status =
        check.ok() ? NonFiniteGrad(*check, where, "this call's contribution") : check.status();
    if (!status.ok()) {
      session.outcomes_.Erase(request_id);
      return status;
    }
    std::swap(session.grad_, staged.grad);
    ++session.contributions_;
    session.computed_on_.Add(staged.head_version);
    Outcome outcome = WithState(session.outcomes_, request_id, ContributionState::kCommitted, 1.0f);
    outcome.hidden_fingerprint = hidden_fingerprint;
    outcome.hidden_on_device = hidden_on_device;
    session.outcomes_.Set(request_id, outcome);
  }
  session.tokens_ += tokens;
  return absl::OkStatus();
}

void SessionStore::AbortContribution(Session& session, const std::string& request_id,
                                     bool deferred) {
  absl::MutexLock lock(&session.mu_);
  --session.in_flight_;
  if (deferred) --session.in_flight_deferred_;
  session.outcomes_.Erase(request_id);
  session.last_used_ = absl::Now();
}

absl::StatusOr<CommitResult> SessionStore::Commit(const std::string& tenant,
                                                  const std::string& head_id,
                                                  const std::string& session_id,
                                                  const std::string& request_id, float scale,
                                                  bool discard) {
  FLCE_ASSIGN_OR_RETURN(std::shared_ptr<Session> session, Find(tenant, head_id, session_id));
  absl::MutexLock lock(&session->mu_);
  session->last_used_ = absl::Now();
  const Outcome* first = session->outcomes_.Find(request_id);
  if (first == nullptr) {
    return absl::NotFoundError(absl::StrCat("request_id \"", request_id,
                                            "\" has no staged contribution in ",
                                            Describe(head_id, session_id)));
  }
  CommitResult result;
  switch (first->state) {
    case ContributionState::kInFlight:
      return absl::FailedPreconditionError(absl::StrCat(
          "request_id \"", request_id, "\" is still computing: commit after its summary"));
    case ContributionState::kCommitted:
    case ContributionState::kDiscarded:
      result.state = first->state;
      result.scale = first->scale;
      result.replayed = true;
      return result;
    case ContributionState::kStaged:
      break;
  }
  auto staged = session->staged_.find(request_id);
  if (staged == session->staged_.end()) {
    return absl::InternalError(
        absl::StrCat("request_id \"", request_id, "\" is staged but its buffer is gone"));
  }
  if (discard) {
    result.state = ContributionState::kDiscarded;
    result.scale = 0.0f;
  } else {
    // As in CompleteContribution: the staged buffer becomes the sum, checked
    // in the same pass, then the accumulator. A sum that is not finite has
    // used the staged buffer up: the contribution is dropped, as discarded.
    absl::StatusOr<FiniteCheck> check = staged->second.grad->ScaleAndAdd(scale, *session->grad_);
    if (!check.ok()) return check.status();
    absl::Status landed =
        NonFiniteGrad(*check, Describe(head_id, session_id), "the staged contribution x scale");
    if (!landed.ok()) {
      session->staged_.erase(staged);
      session->outcomes_.Set(request_id, WithState(session->outcomes_, request_id,
                                                   ContributionState::kDiscarded, 0.0f));
      return absl::InvalidArgumentError(absl::StrCat(
          landed.message(), "; the staged contribution was dropped (scale = ", scale, ")"));
    }
    std::swap(session->grad_, staged->second.grad);
    ++session->contributions_;
    session->computed_on_.Add(staged->second.head_version);
    result.state = ContributionState::kCommitted;
    result.scale = scale;
  }
  session->staged_.erase(staged);
  session->outcomes_.Set(request_id,
                         WithState(session->outcomes_, request_id, result.state, result.scale));
  return result;
}

absl::StatusOr<GradSnapshot> SessionStore::Snapshot(const std::string& tenant,
                                                    const std::string& head_id,
                                                    const std::string& session_id, bool reset,
                                                    const std::string& request_id) {
  FLCE_ASSIGN_OR_RETURN(std::shared_ptr<Session> session, Find(tenant, head_id, session_id));
  const bool keyed = reset && !request_id.empty();
  {
    absl::MutexLock lock(&session->mu_);
    if (keyed) {
      absl::StatusOr<GradSnapshot> seen = session->RepeatedResetLocked(request_id);
      if (!seen.ok() || seen->grad != nullptr) return seen;
    }
  }
  // Allocated outside the lock (it can be large); a concurrent reset with the
  // same id may win meanwhile, so the check is made again under the lock.
  FLCE_ASSIGN_OR_RETURN(std::unique_ptr<GradBuffer> fresh, engine_->NewGradBuffer(session->spec()));
  absl::MutexLock lock(&session->mu_);
  if (keyed) {
    absl::StatusOr<GradSnapshot> seen = session->RepeatedResetLocked(request_id);
    if (!seen.ok() || seen->grad != nullptr) return seen;
  }
  session->last_used_ = absl::Now();
  GradSnapshot snapshot;
  snapshot.contributions = session->contributions_;
  snapshot.computed_on = session->computed_on_;
  if (reset) {
    session->computed_on_ = VersionRange{};
    std::shared_ptr<const GradBuffer> old(std::move(session->grad_));
    session->grad_ = std::move(fresh);
    session->contributions_ = 0;
    session->last_reset_request_id_ = request_id;
    session->last_reset_grad_ = request_id.empty() ? nullptr : old;
    session->last_reset_contributions_ = snapshot.contributions;
    if (keyed) {
      session->reset_ids_.push_back(request_id);
      while (session->reset_ids_.size() > Session::kResetIdsKept) session->reset_ids_.pop_front();
    }
    snapshot.grad = std::move(old);
  } else {
    FLCE_RETURN_IF_ERROR(fresh->AddScaled(*session->grad_, 1.0f));
    snapshot.grad = std::move(fresh);
  }
  return snapshot;
}

absl::StatusOr<GradSnapshot> Session::RepeatedResetLocked(const std::string& request_id) const {
  if (request_id == last_reset_request_id_ && last_reset_grad_ != nullptr) {
    return GradSnapshot{last_reset_grad_, last_reset_contributions_, true};
  }
  if (std::find(reset_ids_.begin(), reset_ids_.end(), request_id) != reset_ids_.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("reset request id \"", request_id,
                     "\" was already applied and its gradient is gone (a later "
                     "reset or ZeroGrad replaced it); "
                     "it is not reset again"));
  }
  return GradSnapshot{};  // not seen: reset
}

absl::Status SessionStore::Zero(const std::string& tenant, const std::string& head_id,
                                const std::string& session_id) {
  FLCE_ASSIGN_OR_RETURN(std::shared_ptr<Session> session, Find(tenant, head_id, session_id));
  absl::MutexLock lock(&session->mu_);
  session->last_used_ = absl::Now();
  FLCE_RETURN_IF_ERROR(session->grad_->Zero());
  session->contributions_ = 0;
  session->computed_on_ = VersionRange{};
  session->last_reset_grad_ = nullptr;  // a retry of that reset is now refused
  return absl::OkStatus();
}

absl::StatusOr<NormSnapshot> SessionStore::Norms(const std::string& tenant,
                                                 const std::string& head_id,
                                                 const std::string& session_id) {
  FLCE_ASSIGN_OR_RETURN(std::shared_ptr<Session> session, Find(tenant, head_id, session_id));
  absl::MutexLock lock(&session->mu_);
  session->last_used_ = absl::Now();
  NormSnapshot out;
  FLCE_ASSIGN_OR_RETURN(out.norms, session->grad_->SquaredNorms());
  out.contributions = session->contributions_;
  out.computed_on = session->computed_on_;
  return out;
}

namespace {

absl::Status SettledLocked(const Session& session, int64_t in_flight, size_t staged) {
  if (in_flight == 0 && staged == 0) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      Describe(session.head_id(), session.session_id()), " has ", in_flight,
      " call(s) in flight and ", staged,
      " staged contribution(s): a step applies a finished gradient, so wait for every call's "
      "summary and Commit or discard what is staged first"));
}

}  // namespace

absl::Status SessionStore::CheckSettled(const std::string& tenant, const std::string& head_id,
                                        const std::string& session_id) const {
  FLCE_ASSIGN_OR_RETURN(std::shared_ptr<Session> session, Find(tenant, head_id, session_id));
  absl::MutexLock lock(&session->mu_);
  return SettledLocked(*session, session->in_flight_, session->staged_.size());
}

absl::StatusOr<int64_t> SessionStore::ConsumeGrad(const std::string& tenant,
                                                  const std::string& head_id,
                                                  const std::string& session_id,
                                                  const GradUse& use) {
  FLCE_ASSIGN_OR_RETURN(std::shared_ptr<Session> session, Find(tenant, head_id, session_id));
  absl::MutexLock lock(&session->mu_);
  FLCE_RETURN_IF_ERROR(SettledLocked(*session, session->in_flight_, session->staged_.size()));
  session->last_used_ = absl::Now();
  FLCE_RETURN_IF_ERROR(use(*session->grad_, session->contributions_));
  FLCE_RETURN_IF_ERROR(session->grad_->Zero());
  const int64_t contributions = session->contributions_;
  session->contributions_ = 0;
  session->computed_on_ = VersionRange{};
  session->last_reset_grad_ = nullptr;
  return contributions;
}

absl::Status SessionStore::Delete(const std::string& tenant, const std::string& head_id,
                                  const std::string& session_id) {
  std::shared_ptr<Session> session;
  {
    absl::MutexLock lock(&mu_);
    auto it = sessions_.find({tenant, head_id, session_id});
    if (it == sessions_.end()) {
      return absl::NotFoundError(absl::StrCat(Describe(head_id, session_id), " does not exist"));
    }
    session = std::move(it->second);
    sessions_.erase(it);
  }
  absl::MutexLock lock(&session->mu_);
  session->deleted_ = true;
  session->staged_.clear();
  session->last_reset_grad_ = nullptr;
  return absl::OkStatus();
}

int64_t SessionStore::DeleteHead(const std::string& owner, const std::string& head_id) {
  std::vector<std::shared_ptr<Session>> dropped;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = sessions_.begin(); it != sessions_.end();) {
      const auto& [tenant, head, session] = it->first;
      if (head == head_id && (owner.empty() || tenant == owner)) {
        dropped.push_back(std::move(it->second));
        it = sessions_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& session : dropped) {
    absl::MutexLock lock(&session->mu_);
    session->deleted_ = true;
    session->staged_.clear();
  }
  return static_cast<int64_t>(dropped.size());
}

std::vector<SessionSummary> SessionStore::List(const std::string& tenant,
                                               const std::string& head_id) const {
  std::vector<std::shared_ptr<Session>> sessions;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [key, session] : sessions_) {
      if (std::get<0>(key) == tenant && (head_id.empty() || std::get<1>(key) == head_id)) {
        sessions.push_back(session);
      }
    }
  }
  return Summaries(sessions);
}

std::vector<SessionSummary> SessionStore::ListAll() const {
  std::vector<std::shared_ptr<Session>> sessions;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [key, session] : sessions_) sessions.push_back(session);
  }
  return Summaries(sessions);
}

std::vector<SessionSummary> SessionStore::Summaries(
    const std::vector<std::shared_ptr<Session>>& sessions) const {
  std::vector<SessionSummary> out;
  absl::Time now = absl::Now();
  for (const auto& session : sessions) {
    absl::MutexLock lock(&session->mu_);
    SessionSummary s;
    s.tenant = session->tenant_;
    s.head_id = session->head_id_;
    s.session_id = session->session_id_;
    s.contributions = session->contributions_;
    s.computed_on = session->computed_on_;
    s.pending = session->in_flight_ + static_cast<int64_t>(session->staged_.size());
    s.tokens = session->tokens_;
    s.idle_seconds = absl::ToDoubleSeconds(now - session->last_used_);
    s.grad_bytes = session->grad_->bytes() +
                   (session->last_reset_grad_ != nullptr ? session->last_reset_grad_->bytes() : 0);
    out.push_back(std::move(s));
  }
  return out;
}

std::vector<std::string> SessionStore::SessionIds(const std::string& owner,
                                                  const std::string& head_id) const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> out;
  for (const auto& [key, session] : sessions_) {
    const auto& [tenant, head, id] = key;
    if (head == head_id && (owner.empty() || tenant == owner)) {
      out.push_back(tenant.empty() ? id : absl::StrCat(tenant, "/", id));
    }
  }
  return out;
}

int64_t SessionStore::Count(const std::string& tenant, const std::string& head_id) const {
  absl::MutexLock lock(&mu_);
  int64_t n = 0;
  for (const auto& [key, session] : sessions_) {
    if (std::get<0>(key) == tenant && std::get<1>(key) == head_id) ++n;
  }
  return n;
}

int64_t SessionStore::Sweep(absl::Time now) {
  std::vector<std::shared_ptr<Session>> expired;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = sessions_.begin(); it != sessions_.end();) {
      Session& session = *it->second;
      bool idle;
      {
        absl::MutexLock session_lock(&session.mu_);
        idle = session.in_flight_ == 0 && now - session.last_used_ > limits_.ttl;
        if (idle) session.deleted_ = true;
      }
      if (idle) {
        expired.push_back(std::move(it->second));
        it = sessions_.erase(it);
      } else {
        ++it;
      }
    }
  }
  // Buffers are freed here, outside the store's lock.
  for (auto& session : expired) {
    absl::MutexLock lock(&session->mu_);
    session->staged_.clear();
  }
  return static_cast<int64_t>(expired.size());
}

}  // namespace flce::server
