// Gradient sessions: per (tenant, head_id, session_id) an fp32 grad_W (+
// grad_b) accumulator in the engine's memory, the staged contributions of calls
// that wait for Commit, and an outcome log that makes retries idempotent.
//
// A compute call's life in a session:
//   auto begin = store.BeginContribution(*session, request_id, fp, deferred);  // or replay
//   ... the engine adds the call's grad_W into a staging buffer ...
//   store.CompleteContribution(*session, request_id, std::move(staged), deferred, tokens,
//                              hidden_fp);
//   // or, on any failure: store.AbortContribution(*session, request_id, deferred);
// The accumulator changes only in CompleteContribution (commit on complete),
// Commit, ZeroGrad and FetchGrad with reset: a failed call never touches it,
// and neither does a contribution whose sum with it would not be finite.
// Sessions always belong to a tenant (auth.h): two tenants naming the same
// session of a shared head hold separate gradients, and neither sees the other's.
#ifndef FLCE_SERVER_STATE_SESSION_STORE_H_
#define FLCE_SERVER_STATE_SESSION_STORE_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "kernels/engine.h"
#include "server/state/staging_budget.h"

namespace flce::server {

enum class ContributionState { kInFlight, kStaged, kCommitted, kDiscarded };

struct Outcome {
  ContributionState state = ContributionState::kInFlight;
  float scale = 0.0f;  // applied scale once committed
  // What the call was (ComputeFingerprint of its header, HiddenFingerprint
  // of its rows): a reused request id with other data is refused rather than
  // "replayed".
  uint64_t fingerprint = 0;
  uint64_t hidden_fingerprint = 0;  // known once the call completed
  bool hidden_on_device = false;     // ...computed on the GPU (cuda_ipc): another function
};

// One call's private fp32 gradient and the staging memory it holds.
struct StagedGrad {
  std::unique_ptr<GradBuffer> grad;
  StagingReservation reservation;
  uint64_t head_version = 0;  // of the head the call computed on
};

// The head versions a session's contributions were computed on; 0 = none.
struct VersionRange {
  uint64_t oldest = 0;
  uint64_t newest = 0;
  void Add(uint64_t version);
};

// Remembers what happened to each request id of a session, oldest finished
// entries forgotten first beyond `capacity`.
class OutcomeLog {
 public:
  explicit OutcomeLog(size_t capacity) : capacity_(capacity) {}
  const Outcome* Find(const std::string& request_id) const;
  void Set(const std::string& request_id, Outcome outcome);
  void Erase(const std::string& request_id);
  size_t size() const { return outcomes_.size(); }

 private:
  size_t capacity_;
  std::map<std::string, Outcome> outcomes_;
  std::deque<std::string> order_;  // insertion order, for eviction
};

struct GradSnapshot;

class Session {
 public:
  Session(std::string tenant, std::string head_id, std::string session_id, HeadSpec spec,
          std::unique_ptr<GradBuffer> grad, size_t outcome_capacity);

  const std::string& head_id() const { return head_id_; }
  const std::string& session_id() const { return session_id_; }
  const HeadSpec& spec() const { return spec_; }

 private:
  friend class SessionStore;

  // The earlier outcome of a FetchGrad-with-reset retry: the saved gradient
  // (replayed), FAILED_PRECONDITION for an older reset whose gradient is gone,
  // or an empty snapshot when the id was never used for a reset.
  absl::StatusOr<GradSnapshot> RepeatedResetLocked(const std::string& request_id) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static constexpr size_t kResetIdsKept = 1024;

  const std::string tenant_;
  const std::string head_id_;
  const std::string session_id_;
  const HeadSpec spec_;
  mutable absl::Mutex mu_;
  std::unique_ptr<GradBuffer> grad_ ABSL_GUARDED_BY(mu_);
  int64_t contributions_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t tokens_ ABSL_GUARDED_BY(mu_) = 0;
  VersionRange computed_on_ ABSL_GUARDED_BY(mu_);
  int64_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;           // calls computing into a staging buffer
  int64_t in_flight_deferred_ ABSL_GUARDED_BY(mu_) = 0;  // of which COMMIT_DEFERRED
  std::map<std::string, StagedGrad> staged_ ABSL_GUARDED_BY(mu_);
  OutcomeLog outcomes_ ABSL_GUARDED_BY(mu_);
  absl::Time last_used_ ABSL_GUARDED_BY(mu_);
  bool deleted_ ABSL_GUARDED_BY(mu_) = false;
  // The buffer swapped out by the last FetchGrad with reset, so that a retry
  // with the same request id gets the same gradient again. Only the last one
  // is kept (a V x H fp32 buffer, counted in grad_bytes; freed by ZeroGrad);
  // the ids of older resets are remembered, bounded, so that their retries
  // are refused instead of resetting a second time.
  std::string last_reset_request_id_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<const GradBuffer> last_reset_grad_ ABSL_GUARDED_BY(mu_);
  int64_t last_reset_contributions_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<std::string> reset_ids_ ABSL_GUARDED_BY(mu_);  // oldest first
};

struct SessionLimits {
  int64_t max_sessions = 1024;
  int64_t max_pending = 16;  // staged + deferred calls in flight, per session
  absl::Duration ttl = absl::Hours(1);
  size_t outcome_log = 4096;
};

struct SessionSummary {
  std::string tenant;
  std::string head_id;
  std::string session_id;
  int64_t contributions = 0;
  int64_t pending = 0;
  int64_t tokens = 0;
  double idle_seconds = 0.0;
  int64_t grad_bytes = 0;
  VersionRange computed_on;
};

struct BeginResult {
  // The request id already completed: recompute without gradients and
  // report the first outcome.
  bool replay = false;
  Outcome first;
};

struct CommitResult {
  ContributionState state = ContributionState::kCommitted;
  bool replayed = false;
  float scale = 0.0f;
};

struct GradSnapshot {
  std::shared_ptr<const GradBuffer> grad;  // private to the caller
  int64_t contributions = 0;
  bool replayed = false;
  VersionRange computed_on;
};

struct NormSnapshot {
  GradNorms norms;
  int64_t contributions = 0;
  VersionRange computed_on;
};

class SessionStore {
 public:
  SessionStore(Engine* engine, SessionLimits limits);

  absl::StatusOr<std::shared_ptr<Session>> GetOrCreate(const std::string& tenant,
                                                       const std::string& head_id,
                                                       const std::string& session_id,
                                                       const HeadSpec& spec);
  // NOT_FOUND naming the pair (another tenant's session is not found either).
  absl::StatusOr<std::shared_ptr<Session>> Find(const std::string& tenant,
                                                const std::string& head_id,
                                                const std::string& session_id) const;

  // Records request_id as in flight (ABORTED if the same id is still in
  // flight), or says the request id completed before. A deferred call needs
  // a staging slot: RESOURCE_EXHAUSTED naming --max-pending when the
  // session's staged contributions and deferred calls in flight fill them.
  // INVALID_ARGUMENT when request_id was used for a call with another
  // fingerprint.
  absl::StatusOr<BeginResult> BeginContribution(Session& session, const std::string& request_id,
                                                uint64_t fingerprint, bool deferred);
  // The call finished: add its gradient to the accumulator now, or keep it
  // staged for Commit. INVALID_ARGUMENT naming grad_W, with nothing landed
  // or staged, when the contribution holds NaN or Inf or the sum would.
  absl::Status CompleteContribution(Session& session, const std::string& request_id,
                                    StagedGrad staged, bool deferred, int64_t tokens,
                                    uint64_t hidden_fingerprint, bool hidden_on_device = false);
  // The call failed or was cancelled: forget it.
  void AbortContribution(Session& session, const std::string& request_id, bool deferred);

  absl::StatusOr<CommitResult> Commit(const std::string& tenant, const std::string& head_id,
                                      const std::string& session_id, const std::string& request_id,
                                      float scale, bool discard);
  // A private copy of the accumulator; with reset, the accumulator itself,
  // replaced by a zeroed one. A reset repeating the last reset's request id
  // returns that reset's gradient again.
  absl::StatusOr<GradSnapshot> Snapshot(const std::string& tenant, const std::string& head_id,
                                        const std::string& session_id, bool reset,
                                        const std::string& request_id);
  absl::Status Zero(const std::string& tenant, const std::string& head_id,
                    const std::string& session_id);
  // The accumulator's squared norms (GradBuffer::SquaredNorms).
  absl::StatusOr<NormSnapshot> Norms(const std::string& tenant, const std::string& head_id,
                                     const std::string& session_id);
  // FAILED_PRECONDITION while the session has calls in flight or staged
  // contributions: an optimizer step needs every contribution landed.
  absl::Status CheckSettled(const std::string& tenant, const std::string& head_id,
                            const std::string& session_id) const;
  // Under the session's lock, settled as above: `use` reads the accumulator
  // and its number of contributions (an optimizer step), then the
  // accumulator is zeroed unless `use` failed. Returns the contributions it
  // held.
  using GradUse = std::function<absl::Status(const GradBuffer& grad, int64_t contributions)>;
  absl::StatusOr<int64_t> ConsumeGrad(const std::string& tenant, const std::string& head_id,
                                      const std::string& session_id, const GradUse& use);
  absl::Status Delete(const std::string& tenant, const std::string& head_id,
                      const std::string& session_id);
  // Drops every session of a head of this owner (registry owner: "" = a
  // shared head, whose sessions belong to every tenant); returns how many.
  int64_t DeleteHead(const std::string& owner, const std::string& head_id);

  // A tenant's sessions; head_id "" = on every head.
  std::vector<SessionSummary> List(const std::string& tenant, const std::string& head_id) const;
  std::vector<SessionSummary> ListAll() const;
  // "tenant/session" ids of the sessions on a head of this registry owner.
  std::vector<std::string> SessionIds(const std::string& owner, const std::string& head_id) const;
  // A tenant's sessions on head_id.
  int64_t Count(const std::string& tenant, const std::string& head_id) const;
  // Drops sessions idle longer than the TTL with no call in flight.
  int64_t Sweep(absl::Time now);

 private:
  using Key = std::tuple<std::string, std::string,
                         std::string>;  // tenant, head, session
  std::vector<SessionSummary> Summaries(
      const std::vector<std::shared_ptr<Session>>& sessions) const;

  Engine* engine_;
  const SessionLimits limits_;
  mutable absl::Mutex mu_;
  std::map<Key, std::shared_ptr<Session>> sessions_ ABSL_GUARDED_BY(mu_);
};

}  // namespace flce::server

#endif  // FLCE_SERVER_STATE_SESSION_STORE_H_
