// health and server-info.
#include "client/cli/command.h"
#include "client/cli/json_views.h"
#include "core/status_macros.h"

namespace flce::cli {

void DeclareHealth(FlagSet& flags) {
  flags.String("service", "service name to ask about; empty = the whole server");
}

absl::StatusOr<CommandResult> RunHealth(const FlagSet& flags, CliEnv& env) {
  FLCE_ASSIGN_OR_RETURN(Client * client, env.client());
  FLCE_ASSIGN_OR_RETURN(HealthStatus status, client->Health(flags.str("service")));
  CommandResult result;
  result.json = {{"status", HealthStatusName(status)}, {"service", flags.str("service")}};
  // Probes and scripts test the exit status: only SERVING is healthy.
  result.exit_code = status == HealthStatus::kServing ? kExitOk : kExitFailed;
  return result;
}

void DeclareServerInfo(FlagSet&) {}

absl::StatusOr<CommandResult> RunServerInfo(const FlagSet&, CliEnv& env) {
  FLCE_ASSIGN_OR_RETURN(Client * client, env.client());
  FLCE_ASSIGN_OR_RETURN(v1::ServerInfo info, client->GetServerInfo());
  return CommandResult{ServerInfoJson(info)};
}

}  // namespace flce::cli
