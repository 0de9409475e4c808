// How many log lines one source may write: at most `lines` per `interval` for
// each key, the rest dropped and counted. A peer that makes the same line
// appear once per message (libprotobuf's invalid-UTF-8 error, a failing call
// site) then costs the log a few lines per interval, not one per message.
// Keys are call sites (file:line), so the table is as small as the code.
//
// Usage (the caller serialises calls):
//   LogRateLimiter limiter(LogRateLimit{20, absl::Seconds(10)});
//   LogRateLimiter::Verdict v = limiter.Admit("server/x.cc:42", absl::Now());
//   if (v.suppressed > 0) ... say how many lines were dropped ...
//   if (v.write) ... write the line ...
#ifndef FLCE_SERVER_OBSERVE_LOG_RATE_LIMITER_H_
#define FLCE_SERVER_OBSERVE_LOG_RATE_LIMITER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace flce::server {

struct LogRateLimit {
  int64_t lines = 20;  // per key and interval; <= 0 = no limit
  absl::Duration interval = absl::Seconds(10);
};

class LogRateLimiter {
 public:
  explicit LogRateLimiter(LogRateLimit limit) : limit_(limit) {}

  struct Verdict {
    bool write = false;
    // Lines of this key dropped since its last written one; non-zero only on
    // a verdict that writes, so that each drop is reported exactly once.
    int64_t suppressed = 0;
    absl::Duration suppressed_over;  // from the first dropped line to now
  };
  // Not thread-safe.
  Verdict Admit(absl::string_view key, absl::Time now);

  const LogRateLimit& limit() const { return limit_; }

 private:
  struct KeyState {
    absl::Time window_start;
    int64_t written = 0;  // in the current window
    int64_t suppressed = 0;
    absl::Time first_suppressed;
  };

  LogRateLimit limit_;
  std::map<std::string, KeyState, std::less<>> keys_;
};

}  // namespace flce::server

#endif  // FLCE_SERVER_OBSERVE_LOG_RATE_LIMITER_H_
