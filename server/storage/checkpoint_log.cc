#include "server/storage/checkpoint_log.h"

namespace flce::server {

std::optional<v1::CheckpointInfo> CheckpointLog::Find(const std::string& tenant,
                                                      const std::string& request_id) const {
  absl::MutexLock lock(&mu_);
  auto it = saves_.find({tenant, request_id});
  if (it == saves_.end()) return std::nullopt;
  return it->second;
}

void CheckpointLog::Record(const std::string& tenant, const std::string& request_id,
                           const v1::CheckpointInfo& info) {
  absl::MutexLock lock(&mu_);
  Key key{tenant, request_id};
  if (saves_.emplace(key, info).second) order_.push_back(std::move(key));
  while (order_.size() > capacity_) {
    saves_.erase(order_.front());
    order_.pop_front();
  }
}

}  // namespace flce::server
