// Which way each recent failed Compute call sent hidden ("shm" or "grpc"), by
// request id: a retry must go the same way, because a GPU server fingerprints
// hidden that came from a region apart from hidden that came in messages and
// would refuse the retry as a different request.
#ifndef FLCE_CLIENT_CPP_RECENT_TRANSPORTS_H_
#define FLCE_CLIENT_CPP_RECENT_TRANSPORTS_H_

#include <cstddef>
#include <deque>
#include <map>
#include <mutex>
#include <string>

namespace flce {

class RecentTransports {
 public:
  explicit RecentTransports(size_t limit = 1024) : limit_(limit) {}

  // The way request_id first went, "" when it has not failed recently.
  std::string Get(const std::string& request_id) const;
  // Keeps the first way a request id went; the oldest ids go past `limit`.
  void Remember(const std::string& request_id, const std::string& transport);

 private:
  const size_t limit_;
  mutable std::mutex mu_;
  std::map<std::string, std::string> by_id_;  // guarded by mu_
  std::deque<std::string> order_;             // guarded by mu_: oldest first
};

}  // namespace flce

#endif  // FLCE_CLIENT_CPP_RECENT_TRANSPORTS_H_
