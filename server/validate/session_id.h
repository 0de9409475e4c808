// The session an RPC names: an empty session_id is the session "default" in
// every RPC (docs/API.md), so that a client that never names one still finds
// the gradients its Compute calls made.
//
// Usage:
//   std::string session_id = SessionIdOrDefault(request.session_id());
#ifndef FLCE_SERVER_VALIDATE_SESSION_ID_H_
#define FLCE_SERVER_VALIDATE_SESSION_ID_H_

#include <string>

#include "absl/strings/string_view.h"

namespace flce::server {

inline constexpr absl::string_view kDefaultSessionId = "default";

std::string SessionIdOrDefault(absl::string_view session_id);

}  // namespace flce::server

#endif  // FLCE_SERVER_VALIDATE_SESSION_ID_H_
