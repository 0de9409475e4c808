// --data-port, read into ServerConfig::data_port:
//   auto   a free port, where the server does not use TLS (the default)
//   none   no data plane (also -1)
//   0      a free port
//   P      TCP port P
#ifndef FLCE_SERVER_BASE_DATA_PORT_FLAG_H_
#define FLCE_SERVER_BASE_DATA_PORT_FLAG_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "server/base/server_config.h"

namespace flce::server {

// INVALID_ARGUMENT quoting the value when it is none of the above; `config`
// unchanged then.
absl::Status ApplyDataPortFlag(absl::string_view value, ServerConfig& config);

}  // namespace flce::server

#endif  // FLCE_SERVER_BASE_DATA_PORT_FLAG_H_
