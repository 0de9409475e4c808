#include "server/base/data_port_flag.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace flce::server {

absl::Status ApplyDataPortFlag(absl::string_view value, ServerConfig& config) {
  if (value == "auto") {
    config.data_port = ServerConfig::kDataPortAuto;
    return absl::OkStatus();
  }
  if (value == "none") {
    config.data_port = ServerConfig::kDataPortNone;
    return absl::OkStatus();
  }
  int port = 0;
  if (absl::SimpleAtoi(value, &port) && port >= -1 && port <= 65535) {
    config.data_port = port;
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--data-port must be auto, none, 0 (any free port) or a TCP port, got '",
                   value, "'"));
}

}  // namespace flce::server
