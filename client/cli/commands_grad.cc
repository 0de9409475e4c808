// commit, fetch-grad, zero-grad, sessions.
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/cli/command.h"
#include "client/cli/json_views.h"
#include "client/cli/tensor_files.h"
#include "client/cpp/wire_dtype.h"
#include "core/status_macros.h"

namespace flce::cli {
namespace {

// "CONTRIBUTION_COMMITTED" -> "COMMITTED".
std::string StateName(v1::ContributionState state) {
  std::string name = v1::ContributionState_Name(state);
  constexpr absl::string_view kPrefix = "CONTRIBUTION_";
  if (absl::StartsWith(name, kPrefix)) name = name.substr(kPrefix.size());
  return name;
}

}  // namespace

void DeclareCommit(FlagSet& flags) {
  flags.String("head", "head id").Required();
  flags.String("session", "session id").Required();
  flags.String("request-id", "the deferred compute call's request id").Required();
  flags.Double("scale", "grad_W += scale * staged contribution", "1");
  flags.Bool("discard", "drop the staged contribution instead");
}

absl::StatusOr<CommandResult> RunCommit(const FlagSet& flags, CliEnv& env) {
  v1::CommitRequest request;
  request.set_head_id(flags.str("head"));
  request.set_session_id(flags.str("session"));
  request.set_request_id(flags.str("request-id"));
  request.set_scale(static_cast<float>(flags.f64("scale")));
  request.set_discard(flags.flag("discard"));
  FLCE_ASSIGN_OR_RETURN(Client * client, env.client());
  FLCE_ASSIGN_OR_RETURN(v1::CommitResponse response, client->Commit(request));
  return CommandResult{{{"request_id", request.request_id()},
                        {"state", StateName(response.state())},
                        {"replayed", response.replayed()},
                        {"scale", response.scale()}}};
}

void DeclareFetchGrad(FlagSet& flags) {
  flags.String("head", "head id").Required();
  flags.String("session", "session id").Required();
  flags.String("out", "write grad_W here (.npy, V x H; bf16 as '<u2')").Required();
  flags.String("out-bias", "write grad_b here (.npy, V) when the head has a bias");
  flags.Choice("dtype", {"fp32", "bf16"}, "fp32", "dtype of the fetched gradient");
  flags.Bool("reset", "zero the accumulator in the same step");
  flags.String("request-id", "with --reset: idempotency key; default: a fresh random one");
  flags.Int("chunk-rows", "rows per message; 0 = the server's choice", "0");
}

absl::StatusOr<CommandResult> RunFetchGrad(const FlagSet& flags, CliEnv& env) {
  FetchGradArgs args;
  args.head_id = flags.str("head");
  args.session_id = flags.str("session");
  FLCE_ASSIGN_OR_RETURN(args.dtype, ParseWireDType(flags.str("dtype")));
  args.reset = flags.flag("reset");
  args.request_id = flags.str("request-id");
  args.chunk_rows = flags.i64("chunk-rows");
  FLCE_ASSIGN_OR_RETURN(Client * client, env.client());
  FLCE_ASSIGN_OR_RETURN(FetchedGrad grad, client->FetchGrad(args));

  const v1::GradHeader& header = grad.header;
  FLCE_RETURN_IF_ERROR(WriteWireTensor(
      flags.str("out"),
      WireTensor{header.dtype(), {header.vocab_size(), header.hidden_size()}, grad.weight}));
  nlohmann::json json = GradHeaderJson(header);
  json["out"] = flags.str("out");
  if (flags.has("out-bias")) {
    if (!header.has_bias()) {
      return absl::FailedPreconditionError(
          absl::StrCat("head ", args.head_id,
                       " has no bias: there is no grad_b for --out-bias (grad_W was "
                       "written to ",
                       flags.str("out"), ")"));
    }
    FLCE_RETURN_IF_ERROR(WriteWireTensor(
        flags.str("out-bias"), WireTensor{header.dtype(), {header.vocab_size()}, grad.bias}));
    json["out_bias"] = flags.str("out-bias");
  }
  json["reset"] = args.reset;
  if (!grad.request_id.empty()) json["request_id"] = grad.request_id;
  return CommandResult{json};
}

void DeclareZeroGrad(FlagSet& flags) {
  flags.String("head", "head id").Required();
  flags.String("session", "session id").Required();
}

absl::StatusOr<CommandResult> RunZeroGrad(const FlagSet& flags, CliEnv& env) {
  FLCE_ASSIGN_OR_RETURN(Client * client, env.client());
  FLCE_RETURN_IF_ERROR(client->ZeroGrad(flags.str("head"), flags.str("session")));
  return CommandResult{
      {{"head_id", flags.str("head")}, {"session_id", flags.str("session")}, {"zeroed", true}}};
}

void DeclareSessions(FlagSet& flags) {
  flags.String("head", "only this head's sessions; with --delete, the session's head");
  flags.String("session", "with --delete: the session to delete");
  flags.Bool("delete", "delete the session named by --head and --session");
}

absl::StatusOr<CommandResult> RunSessions(const FlagSet& flags, CliEnv& env) {
  if (flags.flag("delete")) {
    if (!flags.has("head") || !flags.has("session")) {
      return UsageError("sessions", "--delete needs --head and --session");
    }
    FLCE_ASSIGN_OR_RETURN(Client * client, env.client());
    FLCE_RETURN_IF_ERROR(client->DeleteSession(flags.str("head"), flags.str("session")));
    return CommandResult{
        {{"deleted", {{"head_id", flags.str("head")}, {"session_id", flags.str("session")}}}}};
  }
  if (flags.has("session")) {
    return UsageError("sessions", "--session is only for --delete; list with --head");
  }
  FLCE_ASSIGN_OR_RETURN(Client * client, env.client());
  FLCE_ASSIGN_OR_RETURN(std::vector<v1::SessionInfo> sessions,
                        client->ListSessions(flags.str("head")));
  nlohmann::json list = nlohmann::json::array();
  for (const v1::SessionInfo& session : sessions) list.push_back(SessionInfoJson(session));
  return CommandResult{{{"sessions", list}}};
}

}  // namespace flce::cli
