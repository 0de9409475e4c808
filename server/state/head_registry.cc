#include "server/state/head_registry.h"

#include <algorithm>
#include <cstdint>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace flce::server {

bool SameGradShape(const HeadSpec& a, const HeadSpec& b) {
  return a.vocab_size == b.vocab_size && a.hidden_size == b.hidden_size && a.has_bias == b.has_bias;
}

int64_t HeadBytes(const HeadSpec& spec) {
  // Saturates: a shape too large for int64 is over every --max-head-bytes.
  int64_t bytes = 0;
  if (__builtin_mul_overflow(spec.vocab_size, spec.hidden_size + (spec.has_bias ? 1 : 0), &bytes) ||
      __builtin_mul_overflow(bytes, static_cast<int64_t>(DTypeSize(spec.dtype)), &bytes)) {
    return INT64_MAX;
  }
  return bytes;
}

void HeadRegistry::SetShapeGuard(ShapeGuard guard) {
  absl::MutexLock lock(&mu_);
  shape_guard_ = std::move(guard);
}

void HeadRegistry::SetLimits(HeadLimits limits) {
  absl::MutexLock lock(&mu_);
  limits_ = limits;
}

absl::StatusOr<std::string> HeadRegistry::WriteOwner(const std::string& tenant, bool admin,
                                                     const std::string& head_id) const {
  if (admin) return std::string();
  absl::MutexLock lock(&mu_);
  if (heads_.count({"", head_id}) > 0) {
    return absl::PermissionDeniedError(
        absl::StrCat("head_id \"", head_id,
                     "\" is a shared head: only an admin token may replace or unload it"));
  }
  return tenant;
}

absl::Status HeadRegistry::CheckLimitsLocked(const Key& key, int64_t new_bytes) const {
  auto it = heads_.find(key);
  int64_t count = static_cast<int64_t>(heads_.size()) + (it == heads_.end() ? 1 : 0);
  if (limits_.max_heads > 0 && count > limits_.max_heads) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot load head \"", key.second, "\": ", heads_.size(),
                     " heads are resident, --max-heads=", limits_.max_heads));
  }
  if (limits_.max_bytes > 0) {
    int64_t total = ResidentBytesLocked(&key);
    if (__builtin_add_overflow(total, new_bytes, &total)) total = INT64_MAX;
    if (total > limits_.max_bytes) {
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot load head \"", key.second, "\" (", new_bytes,
                       " bytes): resident heads would take ", total,
                       " bytes, --max-head-bytes=", limits_.max_bytes));
    }
  }
  // An id is shared or private, never both (see the header).
  if (key.first.empty()) {
    for (const auto& [k, entry] : heads_) {
      if (!k.first.empty() && k.second == key.second) {
        return absl::FailedPreconditionError(absl::StrCat(
            "head_id \"", key.second, "\" is in use by a tenant's own head: choose another id"));
      }
    }
  } else if (heads_.count({"", key.second}) > 0) {
    return absl::PermissionDeniedError(absl::StrCat(
        "head_id \"", key.second, "\" is a shared head: only an admin may replace it"));
  }
  return absl::OkStatus();
}

int64_t HeadRegistry::ResidentBytesLocked(const Key* except) const {
  int64_t total = 0;
  for (const auto& [k, entry] : heads_) {
    if (except != nullptr && k == *except) continue;
    int64_t bytes = HeadBytes(entry.head->spec());
    if (__builtin_add_overflow(bytes, entry.training->state_bytes(), &bytes) ||
        __builtin_add_overflow(total, bytes, &total)) {
      return INT64_MAX;
    }
  }
  return total;
}

absl::Status HeadRegistry::CheckReplaceTrainedLocked(const Key& key, bool reset_optimizer) const {
  auto it = heads_.find(key);
  if (it == heads_.end() || reset_optimizer || !it->second.training->has_optimizer()) {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "head \"", key.second,
      "\" is trained on the server (it has optimizer state): a new weight "
      "would silently drop its master weight and moments; set reset_optimizer to replace the "
      "weight and drop the state"));
}

absl::Status HeadRegistry::ReserveStateBytes(const std::string& owner, const std::string& head_id,
                                             const HeadTrainingState* training, int64_t bytes) {
  absl::MutexLock lock(&mu_);
  Key key{owner, head_id};
  auto it = heads_.find(key);
  if (it == heads_.end() || it->second.training.get() != training) {
    return absl::AbortedError(absl::StrCat("head \"", head_id, "\" was replaced or unloaded"));
  }
  if (limits_.max_bytes > 0) {
    int64_t total = ResidentBytesLocked(&key);
    int64_t own = HeadBytes(it->second.head->spec());
    if (__builtin_add_overflow(total, own, &total) ||
        __builtin_add_overflow(total, bytes, &total)) {
      total = INT64_MAX;
    }
    if (total > limits_.max_bytes) {
      return absl::ResourceExhaustedError(
          absl::StrCat("the optimizer state of head \"", head_id, "\" (", bytes,
                       " bytes) does not fit: resident heads and their optimizer state would take ",
                       total, " bytes, --max-head-bytes=", limits_.max_bytes));
    }
  }
  it->second.training->set_state_bytes(bytes);
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> HeadRegistry::BumpVersion(const std::string& owner,
                                                   const std::string& head_id,
                                                   const HeadTrainingState* training) {
  absl::MutexLock lock(&mu_);
  Key key{owner, head_id};
  auto it = heads_.find(key);
  if (it == heads_.end() || it->second.training.get() != training) {
    return absl::AbortedError(absl::StrCat("head \"", head_id, "\" was replaced or unloaded"));
  }
  it->second.version = ++last_version_[key];
  return it->second.version;
}

absl::Status HeadRegistry::CheckPut(const std::string& owner, const std::string& head_id,
                                    const HeadSpec& spec, const PutOptions& options) const {
  absl::MutexLock lock(&mu_);
  Key key{owner, head_id};
  const int64_t state_bytes = options.training ? options.training->state_bytes() : 0;
  if (absl::Status limits = CheckLimitsLocked(key, HeadBytes(spec) + state_bytes); !limits.ok()) {
    return limits;
  }
  if (absl::Status trained = CheckReplaceTrainedLocked(key, options.reset_optimizer);
      !trained.ok()) {
    return trained;
  }
  auto it = heads_.find(key);
  if (it == heads_.end() || SameGradShape(it->second.head->spec(), spec)) {
    return absl::OkStatus();
  }
  return shape_guard_ ? shape_guard_(owner, head_id) : absl::OkStatus();
}

absl::StatusOr<HeadEntry> HeadRegistry::Put(const std::string& owner, const std::string& head_id,
                                            std::shared_ptr<const Head> head,
                                            const std::string& source, const PutOptions& options) {
  absl::MutexLock lock(&mu_);
  Key key{owner, head_id};
  const int64_t state_bytes = options.training ? options.training->state_bytes() : 0;
  if (absl::Status limits = CheckLimitsLocked(key, HeadBytes(head->spec()) + state_bytes);
      !limits.ok()) {
    return limits;
  }
  if (absl::Status trained = CheckReplaceTrainedLocked(key, options.reset_optimizer);
      !trained.ok()) {
    return trained;
  }
  auto it = heads_.find(key);
  if (it != heads_.end() && !SameGradShape(it->second.head->spec(), head->spec()) && shape_guard_) {
    absl::Status guard = shape_guard_(owner, head_id);
    if (!guard.ok()) return guard;
  }
  HeadEntry entry;
  entry.owner = owner;
  entry.head_id = head_id;
  entry.head = std::move(head);
  uint64_t& last = last_version_[key];
  last = std::max(last + 1, options.min_version);
  entry.version = last;
  entry.source = source;
  entry.training = options.training ? options.training : std::make_shared<HeadTrainingState>();
  heads_[key] = entry;
  return entry;
}

absl::StatusOr<HeadEntry> HeadRegistry::Get(const std::string& tenant,
                                            const std::string& head_id) const {
  absl::MutexLock lock(&mu_);
  auto it = heads_.find({tenant, head_id});
  if (it == heads_.end()) it = heads_.find({"", head_id});
  if (it != heads_.end()) return it->second;
  std::vector<std::string> ids;
  for (const auto& [key, entry] : heads_) {
    if (key.first.empty() || key.first == tenant) ids.push_back(key.second);
  }
  return absl::NotFoundError(absl::StrCat("head_id \"", head_id, "\" is not loaded (heads: ",
                                          ids.empty() ? "none" : absl::StrJoin(ids, ", "), ")"));
}

absl::StatusOr<HeadEntry> HeadRegistry::Remove(const std::string& owner,
                                               const std::string& head_id) {
  absl::MutexLock lock(&mu_);
  auto it = heads_.find({owner, head_id});
  if (it == heads_.end()) {
    return absl::NotFoundError(absl::StrCat("head_id \"", head_id, "\" is not loaded"));
  }
  HeadEntry entry = std::move(it->second);
  heads_.erase(it);
  return entry;
}

std::vector<HeadEntry> HeadRegistry::List(const std::string& tenant) const {
  absl::MutexLock lock(&mu_);
  std::vector<HeadEntry> out;
  for (const auto& [key, entry] : heads_) {
    if (key.first.empty() || key.first == tenant) out.push_back(entry);
  }
  return out;
}

std::vector<HeadEntry> HeadRegistry::ListAll() const {
  absl::MutexLock lock(&mu_);
  std::vector<HeadEntry> out;
  out.reserve(heads_.size());
  for (const auto& [key, entry] : heads_) out.push_back(entry);
  return out;
}

}  // namespace flce::server
