#include "server/validate/session_id.h"

namespace flce::server {

std::string SessionIdOrDefault(absl::string_view session_id) {
  return std::string(session_id.empty() ? kDefaultSessionId : session_id);
}

}  // namespace flce::server
