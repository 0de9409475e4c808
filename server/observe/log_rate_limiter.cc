#include "server/observe/log_rate_limiter.h"

namespace flce::server {

LogRateLimiter::Verdict LogRateLimiter::Admit(absl::string_view key, absl::Time now) {
  Verdict verdict;
  if (limit_.lines <= 0) {
    verdict.write = true;
    return verdict;
  }
  auto it = keys_.find(key);
  if (it == keys_.end()) {
    it = keys_.emplace(std::string(key), KeyState{}).first;
    it->second.window_start = now;
  }
  KeyState& state = it->second;
  // A clock that steps back starts a new window too: never a stuck key.
  if (now - state.window_start >= limit_.interval || now < state.window_start) {
    state.window_start = now;
    state.written = 0;
  }
  if (state.written >= limit_.lines) {
    if (state.suppressed++ == 0) state.first_suppressed = now;
    return verdict;
  }
  ++state.written;
  verdict.write = true;
  verdict.suppressed = state.suppressed;
  if (state.suppressed > 0) verdict.suppressed_over = now - state.first_suppressed;
  state.suppressed = 0;
  return verdict;
}

}  // namespace flce::server
