// --local-transports, read into ServerConfig:
//   auto        shm and cuda_ipc for clients on the server's Unix socket that
//               run as the server's user (the default)
//   none        no regions: every client sends messages
//   shm,cuda_ipc  those kinds for every client on this host: loopback TCP or
//               the Unix socket, any user (the rule before 0.11)
//   same-uid:shm  those kinds, for the server's user on its Unix socket only
#ifndef FLCE_SERVER_BASE_LOCAL_TRANSPORTS_FLAG_H_
#define FLCE_SERVER_BASE_LOCAL_TRANSPORTS_FLAG_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "server/base/server_config.h"

namespace flce::server {

// INVALID_ARGUMENT naming the part it does not know; `config` unchanged then.
absl::Status ApplyLocalTransportsFlag(absl::string_view value, ServerConfig& config);

}  // namespace flce::server

#endif  // FLCE_SERVER_BASE_LOCAL_TRANSPORTS_FLAG_H_
