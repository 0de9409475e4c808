// What a flce-client subcommand is: its flags, and a run function that
// returns the one JSON object to print (or a status to print as an error).
#ifndef FLCE_CLIENT_CLI_COMMAND_H_
#define FLCE_CLIENT_CLI_COMMAND_H_

#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "client/cli/flags.h"
#include "client/cpp/client.h"
#include "nlohmann/json.hpp"

namespace flce::cli {

// Exit statuses of flce-client.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailed = 1;  // a call or a local step failed
inline constexpr int kExitUsage = 2;   // the command line is wrong

struct CommandResult {
  nlohmann::json json;
  int exit_code = kExitOk;  // e.g. health NOT_SERVING prints its status and exits 1
};

// What every subcommand gets besides its flags.
class CliEnv {
 public:
  CliEnv(ClientOptions options, std::ostream& err, bool err_is_terminal)
      : options_(std::move(options)), err_(err), err_is_terminal_(err_is_terminal) {}

  const ClientOptions& options() const { return options_; }
  // Connects on first use, so that usage errors never wait for a channel.
  absl::StatusOr<Client*> client();
  std::ostream& err() { return err_; }
  // Progress goes to stderr only when a person is watching it.
  bool show_progress() const { return err_is_terminal_; }

 private:
  ClientOptions options_;
  std::ostream& err_;
  bool err_is_terminal_;
  std::unique_ptr<Client> client_;
};

struct Command {
  const char* name;
  const char* summary;
  void (*declare)(FlagSet& flags);
  absl::StatusOr<CommandResult> (*run)(const FlagSet& flags, CliEnv& env);
};

// Every subcommand, in the order --help lists them.
const std::vector<Command>& Commands();

// A bad combination of flags found after parsing: printed like a parse
// error and exits kExitUsage.
absl::Status UsageError(absl::string_view command, absl::string_view message);
bool IsUsageError(const absl::Status& status);

// The subcommands, one file per group.
void DeclareCreateOptimizer(FlagSet& flags);
absl::StatusOr<CommandResult> RunCreateOptimizer(const FlagSet& flags, CliEnv& env);
void DeclareStep(FlagSet& flags);
absl::StatusOr<CommandResult> RunStep(const FlagSet& flags, CliEnv& env);
void DeclareGradNorm(FlagSet& flags);
absl::StatusOr<CommandResult> RunGradNorm(const FlagSet& flags, CliEnv& env);
void DeclareSaveCheckpoint(FlagSet& flags);
absl::StatusOr<CommandResult> RunSaveCheckpoint(const FlagSet& flags, CliEnv& env);
void DeclareLoadCheckpoint(FlagSet& flags);
absl::StatusOr<CommandResult> RunLoadCheckpoint(const FlagSet& flags, CliEnv& env);

void DeclareHealth(FlagSet& flags);
absl::StatusOr<CommandResult> RunHealth(const FlagSet& flags, CliEnv& env);
void DeclareServerInfo(FlagSet& flags);
absl::StatusOr<CommandResult> RunServerInfo(const FlagSet& flags, CliEnv& env);

void DeclareLoadWeight(FlagSet& flags);
absl::StatusOr<CommandResult> RunLoadWeight(const FlagSet& flags, CliEnv& env);
void DeclareLoadFile(FlagSet& flags);
absl::StatusOr<CommandResult> RunLoadFile(const FlagSet& flags, CliEnv& env);
void DeclareDescribe(FlagSet& flags);
absl::StatusOr<CommandResult> RunDescribe(const FlagSet& flags, CliEnv& env);
void DeclareListHeads(FlagSet& flags);
absl::StatusOr<CommandResult> RunListHeads(const FlagSet& flags, CliEnv& env);
void DeclareUnload(FlagSet& flags);
absl::StatusOr<CommandResult> RunUnload(const FlagSet& flags, CliEnv& env);

void DeclareCompute(FlagSet& flags);
absl::StatusOr<CommandResult> RunCompute(const FlagSet& flags, CliEnv& env);

void DeclareCommit(FlagSet& flags);
absl::StatusOr<CommandResult> RunCommit(const FlagSet& flags, CliEnv& env);
void DeclareFetchGrad(FlagSet& flags);
absl::StatusOr<CommandResult> RunFetchGrad(const FlagSet& flags, CliEnv& env);
void DeclareZeroGrad(FlagSet& flags);
absl::StatusOr<CommandResult> RunZeroGrad(const FlagSet& flags, CliEnv& env);
void DeclareSessions(FlagSet& flags);
absl::StatusOr<CommandResult> RunSessions(const FlagSet& flags, CliEnv& env);

void DeclareDownloadHead(FlagSet& flags);
absl::StatusOr<CommandResult> RunDownloadHead(const FlagSet& flags, CliEnv& env);
void DeclareEmbed(FlagSet& flags);
absl::StatusOr<CommandResult> RunEmbed(const FlagSet& flags, CliEnv& env);

void DeclareBench(FlagSet& flags);
absl::StatusOr<CommandResult> RunBench(const FlagSet& flags, CliEnv& env);

}  // namespace flce::cli

#endif  // FLCE_CLIENT_CLI_COMMAND_H_
