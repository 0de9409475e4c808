// Resident heads by (owner, id). A head is immutable: replacing one swaps in a
// new shared_ptr and bumps the id's version, so calls in flight finish on the
// head they started with.
//
// Owners: "" is the shared namespace (heads preloaded at start or put by an
// admin: every tenant computes with them); any other owner is a tenant whose
// heads nobody else sees. An id is either shared or private (to one or more
// tenants, each with its own head), never both, so a (tenant, id) pair names
// one head: the tenant's own if it has one, else the shared one.
//
// Usage:
//   HeadRegistry heads;
//   FLCE_ASSIGN_OR_RETURN(HeadEntry e, heads.Put("", "h1", head, "upload"));
//   FLCE_ASSIGN_OR_RETURN(HeadEntry now, heads.Get("tenant-a", "h1"));   // a
//   snapshot
#ifndef FLCE_SERVER_STATE_HEAD_REGISTRY_H_
#define FLCE_SERVER_STATE_HEAD_REGISTRY_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "kernels/engine.h"
#include "server/state/head_training_state.h"

namespace flce::server {

struct HeadEntry {
  std::string owner;  // "" = shared
  std::string head_id;
  std::shared_ptr<const Head> head;
  uint64_t version = 0;
  std::string source;  // "upload", "file:<path>", "embedded-demo"
  // Gate, optimizer and step log: shared by every snapshot of this head,
  // replaced with the head's weight.
  std::shared_ptr<HeadTrainingState> training;
};

struct PutOptions {
  // Replacing a head with optimizer state drops it; refused otherwise.
  bool reset_optimizer = false;
  // The new version is at least this (a checkpoint's own).
  uint64_t min_version = 0;
  // The head's training state prepared beforehand (a checkpoint's optimizer),
  // its state_bytes() counted against --max-head-bytes from the start; null:
  // a fresh one.
  std::shared_ptr<HeadTrainingState> training;
};

inline PutOptions ResetOptimizer(bool reset) {
  PutOptions options;
  options.reset_optimizer = reset;
  return options;
}

struct HeadLimits {
  int64_t max_heads = 0;  // resident heads, all owners; 0 = no limit
  int64_t max_bytes = 0;  // resident bytes, all owners; 0 = no limit
};

class HeadRegistry {
 public:
  // Called under the registry's lock before a head is replaced with a
  // different shape; a non-OK status refuses the replacement (sessions whose
  // gradients have the old shape).
  using ShapeGuard = std::function<absl::Status(const std::string& owner, const std::string& id)>;

  void SetShapeGuard(ShapeGuard guard);
  void SetLimits(HeadLimits limits);

  // The owner a write of head_id by this caller goes to: "" for an admin,
  // else the tenant. PERMISSION_DENIED when a non-admin names a shared head.
  absl::StatusOr<std::string> WriteOwner(const std::string& tenant, bool admin,
                                         const std::string& head_id) const;

  // Adds or replaces (owner, head_id); returns the new entry (version
  // bumped). RESOURCE_EXHAUSTED naming --max-heads / --max-head-bytes;
  // FAILED_PRECONDITION replacing a head with optimizer state unless
  // reset_optimizer (which drops the state with the old weight).
  absl::StatusOr<HeadEntry> Put(const std::string& owner, const std::string& head_id,
                                std::shared_ptr<const Head> head, const std::string& source,
                                const PutOptions& options = {});
  // The head `tenant` sees under head_id: its own, else the shared one.
  // NOT_FOUND naming the id and the ones the tenant sees.
  absl::StatusOr<HeadEntry> Get(const std::string& tenant, const std::string& head_id) const;
  // OK if (owner, head_id) may be replaced by a head of shape `spec` (or is
  // new and fits the limits).
  absl::Status CheckPut(const std::string& owner, const std::string& head_id, const HeadSpec& spec,
                        const PutOptions& options = {}) const;
  // Counts `bytes` of optimizer state for (owner, head_id)'s current head
  // against --max-head-bytes and reserves them in its HeadTrainingState.
  // RESOURCE_EXHAUSTED when they do not fit; ABORTED when the head was
  // replaced since `training` was read.
  absl::Status ReserveStateBytes(const std::string& owner, const std::string& head_id,
                                 const HeadTrainingState* training, int64_t bytes);
  // An applied optimizer step changed the weight in place: bumps the
  // version of (owner, head_id), still holding `training`; the new version.
  absl::StatusOr<uint64_t> BumpVersion(const std::string& owner, const std::string& head_id,
                                       const HeadTrainingState* training);
  absl::StatusOr<HeadEntry> Remove(const std::string& owner, const std::string& head_id);
  // The heads `tenant` sees (its own and the shared ones).
  std::vector<HeadEntry> List(const std::string& tenant) const;
  std::vector<HeadEntry> ListAll() const;

 private:
  using Key = std::pair<std::string, std::string>;  // owner, head_id
  absl::Status CheckLimitsLocked(const Key& key, int64_t new_bytes) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckReplaceTrainedLocked(const Key& key, bool reset_optimizer) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Resident bytes of every head but `except` (its weight and optimizer state).
  int64_t ResidentBytesLocked(const Key* except) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  std::map<Key, HeadEntry> heads_ ABSL_GUARDED_BY(mu_);
  // Versions survive an unload, so that an expected_head_version taken before
  // an unload and re-upload never matches the new head by accident.
  std::map<Key, uint64_t> last_version_ ABSL_GUARDED_BY(mu_);
  ShapeGuard shape_guard_ ABSL_GUARDED_BY(mu_);
  HeadLimits limits_ ABSL_GUARDED_BY(mu_);
};

// True if a and b have the same V, H and bias (the gradient's shape).
bool SameGradShape(const HeadSpec& a, const HeadSpec& b);

// Bytes of a head of this shape: weight + bias in its dtype (HeadInfo's
// weight_bytes, flce_head_weight_bytes, what --max-head-bytes counts). An
// engine may keep more (the CPU engine converts bf16 to fp32).
int64_t HeadBytes(const HeadSpec& spec);

}  // namespace flce::server

#endif  // FLCE_SERVER_STATE_HEAD_REGISTRY_H_
