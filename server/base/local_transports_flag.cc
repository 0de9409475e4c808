#include "server/base/local_transports_flag.h"

#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace flce::server {

absl::Status ApplyLocalTransportsFlag(absl::string_view value, ServerConfig& config) {
  ServerConfig parsed = config;
  parsed.shm_transport = false;
  parsed.cuda_ipc_transport = false;
  parsed.local_transports_same_uid = false;
  parsed.local_transports_auto = false;
  absl::string_view kinds = value;
  if (value == "auto") {
    parsed.shm_transport = true;
    parsed.cuda_ipc_transport = true;
    parsed.local_transports_same_uid = true;
    parsed.local_transports_auto = true;
    kinds = "";
  } else if (value == "none" || value.empty()) {
    kinds = "";
  } else if (absl::ConsumePrefix(&kinds, "same-uid:")) {
    parsed.local_transports_same_uid = true;
    if (kinds.empty()) {
      return absl::InvalidArgumentError(
          "--local-transports=same-uid: names no transport (same-uid:shm, same-uid:cuda_ipc or "
          "same-uid:shm,cuda_ipc)");
    }
  }
  for (absl::string_view kind : absl::StrSplit(kinds, ',', absl::SkipEmpty())) {
    if (kind == "shm") {
      parsed.shm_transport = true;
    } else if (kind == "cuda_ipc") {
      parsed.cuda_ipc_transport = true;
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "--local-transports=", value, ": unknown transport \"", kind,
          "\" (known: auto, none, shm, cuda_ipc, same-uid:KINDS)"));
    }
  }
  config = parsed;
  return absl::OkStatus();
}

}  // namespace flce::server
