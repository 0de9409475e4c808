// flce-client's main, callable in-process (tests run it without a server to
// check usage errors and help).
#ifndef FLCE_CLIENT_CLI_CLI_MAIN_H_
#define FLCE_CLIENT_CLI_CLI_MAIN_H_

#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "nlohmann/json.hpp"

namespace flce::cli {

// args excludes the program name. Prints exactly one JSON object on `out`
// (or help text for --help) and returns the exit status.
int RunCli(const std::vector<std::string>& args, std::ostream& out, std::ostream& err,
           bool err_is_terminal);

// {"error": {"code": "INVALID_ARGUMENT", "message": "..."}}
nlohmann::json ErrorJson(const absl::Status& status);

}  // namespace flce::cli

#endif  // FLCE_CLIENT_CLI_CLI_MAIN_H_
