// The outcomes of recent SaveCheckpoint requests by (tenant, request id), so
// that a retried save writes nothing again, even after the head was replaced
// (by a LoadCheckpoint, say) in between.
#ifndef FLCE_SERVER_STORAGE_CHECKPOINT_LOG_H_
#define FLCE_SERVER_STORAGE_CHECKPOINT_LOG_H_

#include <deque>
#include <map>
#include <optional>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "flce/v1/flce.pb.h"

namespace flce::server {

class CheckpointLog {
 public:
  explicit CheckpointLog(size_t capacity = 4096) : capacity_(capacity) {}

  std::optional<v1::CheckpointInfo> Find(const std::string& tenant,
                                         const std::string& request_id) const;
  // Oldest entries are forgotten first beyond the capacity.
  void Record(const std::string& tenant, const std::string& request_id,
              const v1::CheckpointInfo& info);

 private:
  using Key = std::pair<std::string, std::string>;
  const size_t capacity_;
  mutable absl::Mutex mu_;
  std::map<Key, v1::CheckpointInfo> saves_ ABSL_GUARDED_BY(mu_);
  std::deque<Key> order_ ABSL_GUARDED_BY(mu_);
};

}  // namespace flce::server

#endif  // FLCE_SERVER_STORAGE_CHECKPOINT_LOG_H_
