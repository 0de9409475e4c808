#include "server/head_registry.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace flce::server {

bool SameGradShape(const HeadSpec& a, const HeadSpec& b) {
  return a.vocab_size == b.vocab_size && a.hidden_size == b.hidden_size && a.has_bias == b.has_bias;
}

void HeadRegistry::SetShapeGuard(ShapeGuard guard) {
  absl::MutexLock lock(&mu_);
  shape_guard_ = std::move(guard);
}

absl::Status HeadRegistry::CheckReplaceable(const std::string& head_id,
                                            const HeadSpec& spec) const {
  absl::MutexLock lock(&mu_);
  auto it = heads_.find(head_id);
  if (it == heads_.end() || SameGradShape(it->second.head->spec(), spec)) {
    return absl::OkStatus();
  }
  return shape_guard_ ? shape_guard_(head_id) : absl::OkStatus();
}

absl::StatusOr<HeadEntry> HeadRegistry::Put(const std::string& head_id,
                                            std::shared_ptr<const Head> head,
                                            const std::string& source) {
  absl::MutexLock lock(&mu_);
  auto it = heads_.find(head_id);
  if (it != heads_.end() && !SameGradShape(it->second.head->spec(), head->spec()) && shape_guard_) {
    absl::Status guard = shape_guard_(head_id);
    if (!guard.ok()) return guard;
  }
  HeadEntry entry;
  entry.head_id = head_id;
  entry.head = std::move(head);
  entry.version = ++last_version_[head_id];
  entry.source = source;
  heads_[head_id] = entry;
  return entry;
}

absl::StatusOr<HeadEntry> HeadRegistry::Get(const std::string& head_id) const {
  absl::MutexLock lock(&mu_);
  auto it = heads_.find(head_id);
  if (it != heads_.end()) return it->second;
  std::vector<std::string> ids;
  for (const auto& [id, entry] : heads_) ids.push_back(id);
  return absl::NotFoundError(absl::StrCat("head_id \"", head_id, "\" is not loaded (heads: ",
                                          ids.empty() ? "none" : absl::StrJoin(ids, ", "), ")"));
}

absl::StatusOr<HeadEntry> HeadRegistry::Remove(const std::string& head_id) {
  absl::MutexLock lock(&mu_);
  auto it = heads_.find(head_id);
  if (it == heads_.end()) {
    return absl::NotFoundError(absl::StrCat("head_id \"", head_id, "\" is not loaded"));
  }
  HeadEntry entry = std::move(it->second);
  heads_.erase(it);
  return entry;
}

std::vector<HeadEntry> HeadRegistry::List() const {
  absl::MutexLock lock(&mu_);
  std::vector<HeadEntry> out;
  out.reserve(heads_.size());
  for (const auto& [id, entry] : heads_) out.push_back(entry);
  return out;
}

}  // namespace flce::server
