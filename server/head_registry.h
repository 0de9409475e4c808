// Resident heads by id. A head is immutable: replacing one swaps in a new
// shared_ptr and bumps the id's version, so calls in flight finish on the
// head they started with.
//
// Usage:
//   HeadRegistry heads;
//   FLCE_ASSIGN_OR_RETURN(HeadEntry e, heads.Put("h1", head, "upload"));
//   FLCE_ASSIGN_OR_RETURN(HeadEntry now, heads.Get("h1"));   // a snapshot
#ifndef FLCE_SERVER_HEAD_REGISTRY_H_
#define FLCE_SERVER_HEAD_REGISTRY_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "kernels/engine.h"

namespace flce::server {

struct HeadEntry {
  std::string head_id;
  std::shared_ptr<const Head> head;
  uint64_t version = 0;
  std::string source;  // "upload", "file:<path>", "embedded-demo"
};

class HeadRegistry {
 public:
  // Called under the registry's lock before a head is replaced with a
  // different shape; a non-OK status refuses the replacement (sessions whose
  // gradients have the old shape).
  using ShapeGuard = std::function<absl::Status(const std::string& head_id)>;

  void SetShapeGuard(ShapeGuard guard);

  // Adds or replaces head_id; returns the new entry (version bumped).
  absl::StatusOr<HeadEntry> Put(const std::string& head_id, std::shared_ptr<const Head> head,
                                const std::string& source);
  // NOT_FOUND naming the id and the resident ones.
  absl::StatusOr<HeadEntry> Get(const std::string& head_id) const;
  // OK if head_id may be replaced by a head of shape `spec` (or is new).
  absl::Status CheckReplaceable(const std::string& head_id, const HeadSpec& spec) const;
  absl::StatusOr<HeadEntry> Remove(const std::string& head_id);
  std::vector<HeadEntry> List() const;

 private:
  mutable absl::Mutex mu_;
  std::map<std::string, HeadEntry> heads_ ABSL_GUARDED_BY(mu_);
  // Versions survive an unload, so that an expected_head_version taken before
  // an unload and re-upload never matches the new head by accident.
  std::map<std::string, uint64_t> last_version_ ABSL_GUARDED_BY(mu_);
  ShapeGuard shape_guard_ ABSL_GUARDED_BY(mu_);
};

// True if a and b have the same V, H and bias (the gradient's shape).
bool SameGradShape(const HeadSpec& a, const HeadSpec& b);

}  // namespace flce::server

#endif  // FLCE_SERVER_HEAD_REGISTRY_H_
