#include "client/cli/command.h"

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"

namespace flce::cli {
namespace {

constexpr char kUsagePayload[] = "flce.cli/usage";

}  // namespace

absl::StatusOr<Client*> CliEnv::client() {
  if (client_ == nullptr) {
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options_);
    if (!client.ok()) return client.status();
    client_ = std::move(*client);
  }
  return client_.get();
}

const std::vector<Command>& Commands() {
  static const std::vector<Command>* commands = new std::vector<Command>{
      {"health", "Asks grpc.health.v1 whether the server (or one service) is serving.",
       DeclareHealth, RunHealth},
      {"server-info", "Prints the server's instance id, version, engine and limits.",
       DeclareServerInfo, RunServerInfo},
      {"load-weight", "Uploads a head's weight (and bias) from .npy files.", DeclareLoadWeight,
       RunLoadWeight},
      {"load-file", "Loads a head from a .safetensors file under the server's --head-root.",
       DeclareLoadFile, RunLoadFile},
      {"describe", "Describes one resident head.", DeclareDescribe, RunDescribe},
      {"list-heads", "Lists the resident heads.", DeclareListHeads, RunListHeads},
      {"unload", "Unloads a head and drops its sessions.", DeclareUnload, RunUnload},
      {"compute", "Runs one fused linear + cross-entropy call on .npy hidden states and targets.",
       DeclareCompute, RunCompute},
      {"commit", "Commits (or discards) a deferred compute call's grad_W contribution.",
       DeclareCommit, RunCommit},
      {"fetch-grad", "Writes a session's accumulated grad_W (and grad_b) to .npy files.",
       DeclareFetchGrad, RunFetchGrad},
      {"zero-grad", "Zeroes a session's accumulated gradient.", DeclareZeroGrad, RunZeroGrad},
      {"sessions", "Lists sessions, or deletes one with --delete.", DeclareSessions, RunSessions},
      {"create-optimizer", "Creates a head's optimizer state on the server (SGD or AdamW).",
       DeclareCreateOptimizer, RunCreateOptimizer},
      {"grad-norm", "A session's squared gradient norm (fp64).", DeclareGradNorm, RunGradNorm},
      {"step", "Applies a session's gradient to the head with its optimizer.", DeclareStep,
       RunStep},
      {"save-checkpoint", "Saves the head and its optimizer state under --checkpoint-dir.",
       DeclareSaveCheckpoint, RunSaveCheckpoint},
      {"load-checkpoint", "Loads a saved checkpoint into a head.", DeclareLoadCheckpoint,
       RunLoadCheckpoint},
      {"download-head", "Writes a head's weight (and bias) to .npy files.", DeclareDownloadHead,
       RunDownloadHead},
      {"embed", "Writes the head's rows of token ids (a tied input embedding) to a .npy file.",
       DeclareEmbed, RunEmbed},
      {"bench",
       "Drives a head with random data; reports tokens/s and bytes/s each way over the step.",
       DeclareBench, RunBench},
  };
  return *commands;
}

absl::Status UsageError(absl::string_view command, absl::string_view message) {
  absl::Status status = absl::InvalidArgumentError(absl::StrCat(
      "flce-client ", command, ": ", message, " (see flce-client ", command, " --help)"));
  status.SetPayload(kUsagePayload, absl::Cord("1"));
  return status;
}

bool IsUsageError(const absl::Status& status) {
  return status.GetPayload(kUsagePayload).has_value();
}

}  // namespace flce::cli
