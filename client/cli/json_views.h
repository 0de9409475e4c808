// The JSON shapes flce-client prints for the service's messages. Field names
// follow the proto's, so a script can read either.
#ifndef FLCE_CLIENT_CLI_JSON_VIEWS_H_
#define FLCE_CLIENT_CLI_JSON_VIEWS_H_

#include "flce/v1/flce.pb.h"
#include "nlohmann/json.hpp"

namespace flce::cli {

nlohmann::json HeadInfoJson(const v1::HeadInfo& head);
nlohmann::json SessionInfoJson(const v1::SessionInfo& session);
nlohmann::json ServerInfoJson(const v1::ServerInfo& info);
// Every summary field at the top level: {"loss": ..., "n_valid": ..., ...}.
// accuracy only when it was asked for (it is 0 otherwise, not a measurement).
nlohmann::json SummaryJson(const v1::ComputeSummary& summary, bool with_accuracy);
nlohmann::json GradHeaderJson(const v1::GradHeader& header);

}  // namespace flce::cli

#endif  // FLCE_CLIENT_CLI_JSON_VIEWS_H_
