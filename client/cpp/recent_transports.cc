#include "client/cpp/recent_transports.h"

namespace flce {

std::string RecentTransports::Get(const std::string& request_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_id_.find(request_id);
  return it == by_id_.end() ? "" : it->second;
}

void RecentTransports::Remember(const std::string& request_id, const std::string& transport) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!by_id_.emplace(request_id, transport).second) return;
  order_.push_back(request_id);
  while (order_.size() > limit_) {
    by_id_.erase(order_.front());
    order_.pop_front();
  }
}

}  // namespace flce
