// The JSON shapes flce-client prints for the service's messages. Field names
// follow the proto's, so a script can read either.
#ifndef FLCE_CLIENT_CLI_JSON_VIEWS_H_
#define FLCE_CLIENT_CLI_JSON_VIEWS_H_

#include <string>

#include "absl/strings/string_view.h"
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
nlohmann::json OptimizerInfoJson(const v1::OptimizerInfo& info);
// "STEP_SKIPPED_FOUND_INF" -> "SKIPPED_FOUND_INF": enum names without their prefix.
std::string WithoutPrefix(const std::string& name, absl::string_view prefix);

}  // namespace flce::cli

#endif  // FLCE_CLIENT_CLI_JSON_VIEWS_H_
