#include "client/cli/cli_main.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "client/cli/command.h"
#include "client/cli/flags.h"

namespace flce::cli {
namespace {

void Print(std::ostream& out, const nlohmann::json& json) {
  // Server messages and file names need not be valid UTF-8; replacing bad
  // bytes keeps the promise of one parseable JSON object.
  out << json.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  out.flush();
}

int Fail(std::ostream& out, const absl::Status& status, int exit_code) {
  Print(out, ErrorJson(status));
  return exit_code;
}

void DeclareGlobal(FlagSet& flags) {
  flags.String("target", "server address, host:port", "127.0.0.1:50051");
  flags.Double("timeout-s", "deadline of each call in seconds; 0 = none", "300");
  flags.Int("max-message-mb",
            "largest gRPC message sent or received; keep <= the server's --max-message-mb", "64");
  flags.Bool("tls", "speak TLS, checking the server against the system's CA roots");
  flags.String("tls-ca", "PEM CA bundle to check the server's certificate with (implies --tls)");
  flags.String("tls-cert", "PEM client certificate, for servers that want mutual TLS");
  flags.String("tls-key", "PEM private key of --tls-cert");
  flags.String("tls-server-name",
               "name to check the server's certificate for, instead of the target's host");
  flags.String("auth-token",
               "bearer token sent with every call (visible to other local users in ps: prefer "
               "--auth-token-file or $FLCE_AUTH_TOKEN)");
  flags.String("auth-token-file", "file whose first line is the bearer token");
  flags.String("transport",
               "how compute and bench move hidden and grad_input: auto (shared memory where the "
               "server offers it on this host, else messages), grpc (messages) or shm",
               "auto");
  flags.Int("connections",
            "connections a compute or bench call's hidden uses in messages (1-9; servers 0.13+ "
            "take more than one)",
            "1");
  flags.String("data-plane",
               "whether compute and bench send hidden and get grad_input as raw bytes on a TCP "
               "connection beside gRPC where they would use messages: auto (where the server "
               "offers it: flce-server --data-port), on (or an error) or off",
               "auto");
}

// Every global flag: each may come before or after the subcommand, not both.
constexpr const char* kGlobalFlags[] = {
    "target",   "timeout-s", "max-message-mb",  "tls",        "tls-ca",
    "tls-cert", "tls-key",   "tls-server-name", "auth-token", "auth-token-file", "transport",
    "connections", "data-plane"};

// The bearer token from --auth-token, --auth-token-file or $FLCE_AUTH_TOKEN.
absl::StatusOr<std::string> AuthToken(const FlagSet& flags) {
  if (flags.has("auth-token") && flags.has("auth-token-file")) {
    return absl::InvalidArgumentError(
        "flce-client: give --auth-token or --auth-token-file, not both");
  }
  if (flags.has("auth-token")) return flags.str("auth-token");
  if (flags.has("auth-token-file")) {
    std::ifstream in(flags.str("auth-token-file"));
    std::string token;
    if (!in || !std::getline(in, token)) {
      return absl::InvalidArgumentError(
          absl::StrCat("flce-client: cannot read a token from --auth-token-file=",
                       flags.str("auth-token-file")));
    }
    return std::string(absl::StripAsciiWhitespace(token));
  }
  const char* env = std::getenv("FLCE_AUTH_TOKEN");
  return std::string(env != nullptr ? env : "");
}

std::string ToolUsage(const FlagSet& global) {
  std::string out = global.Usage();
  absl::StrAppend(&out, "\nsubcommands:\n");
  size_t width = 0;
  for (const Command& command : Commands()) width = std::max(width, std::strlen(command.name));
  for (const Command& command : Commands()) {
    std::string name = command.name;
    name.resize(width + 2, ' ');
    absl::StrAppend(&out, "  ", name, command.summary, "\n");
  }
  absl::StrAppend(&out,
                  "\nEvery subcommand prints one JSON object on stdout. A failure prints\n"
                  "{\"error\": {\"code\": ..., \"message\": ...}} and exits 1 (2 for usage "
                  "errors).\n"
                  "The global flags may also follow the subcommand.\n"
                  "flce-client SUBCOMMAND --help describes a subcommand's flags.\n");
  return out;
}

}  // namespace

nlohmann::json ErrorJson(const absl::Status& status) {
  return {{"error",
           {{"code", absl::StatusCodeToString(status.code())},
            {"message", std::string(status.message())}}}};
}

int RunCli(const std::vector<std::string>& args, std::ostream& out, std::ostream& err,
           bool err_is_terminal) {
  FlagSet global("", "flce-client: the command-line client of the flce service.");
  DeclareGlobal(global);
  std::vector<std::string> rest;
  if (absl::Status s = global.Parse(args, /*stop_at_positional=*/true, &rest); !s.ok()) {
    return Fail(out, s, kExitUsage);
  }
  if (rest.empty()) {
    if (global.help()) {
      out << ToolUsage(global);
      return kExitOk;
    }
    return Fail(
        out,
        absl::InvalidArgumentError("flce-client: no subcommand given (see flce-client --help)"),
        kExitUsage);
  }
  const Command* command = nullptr;
  for (const Command& c : Commands()) {
    if (rest[0] == c.name) command = &c;
  }
  if (command == nullptr) {
    return Fail(out,
                absl::InvalidArgumentError(absl::StrCat("flce-client: unknown subcommand '",
                                                        rest[0], "' (see flce-client --help)")),
                kExitUsage);
  }
  FlagSet flags(command->name, command->summary);
  command->declare(flags);
  // The global flags are accepted after the subcommand too: people append
  // --target to a command line they already have.
  DeclareGlobal(flags);
  if (absl::Status s = flags.Parse({rest.begin() + 1, rest.end()}); !s.ok()) {
    return Fail(out, s, kExitUsage);
  }
  if (flags.help() || global.help()) {
    out << flags.Usage();
    return kExitOk;
  }
  // The global flags as one set, wherever each was given.
  FlagSet merged("", "");
  DeclareGlobal(merged);
  std::vector<std::string> merged_args;
  for (const char* name : kGlobalFlags) {
    if (global.has(name) && flags.has(name)) {
      return Fail(out,
                  absl::InvalidArgumentError(absl::StrCat(
                      "flce-client: --", name, " given both before and after the subcommand")),
                  kExitUsage);
    }
    const FlagSet& from = flags.has(name) ? flags : global;
    if (from.has(name)) merged_args.push_back(absl::StrCat("--", name, "=", from.str(name)));
  }
  if (absl::Status s = merged.Parse(merged_args); !s.ok()) return Fail(out, s, kExitUsage);
  const FlagSet& target_flags = merged;
  const FlagSet& timeout_flags = merged;
  const FlagSet& size_flags = merged;

  ClientOptions options;
  options.target = target_flags.str("target");
  const double timeout_s = timeout_flags.f64("timeout-s");
  if (!(timeout_s >= 0) || std::isinf(timeout_s)) {
    return Fail(out, absl::InvalidArgumentError("flce-client: --timeout-s must be >= 0"),
                kExitUsage);
  }
  options.timeout = timeout_s > 0 ? absl::Seconds(timeout_s) : absl::InfiniteDuration();
  const int64_t max_mb = size_flags.i64("max-message-mb");
  if (max_mb < 1 || max_mb > 2047) {
    return Fail(out,
                absl::InvalidArgumentError("flce-client: --max-message-mb must be in [1, 2047]"),
                kExitUsage);
  }
  options.max_message_bytes = max_mb << 20;
  const int64_t connections = size_flags.i64("connections");
  if (connections < 1 || connections > 9) {
    return Fail(out,
                absl::InvalidArgumentError("flce-client: --connections must be in [1, 9]"),
                kExitUsage);
  }
  options.connections = static_cast<int>(connections);
  options.chunk_bytes = std::min<int64_t>(options.chunk_bytes, options.max_message_bytes / 2);
  options.tls = merged.flag("tls");
  options.tls_ca_file = merged.str("tls-ca");
  options.tls_cert_file = merged.str("tls-cert");
  options.tls_key_file = merged.str("tls-key");
  options.tls_server_name = merged.str("tls-server-name");
  if (options.tls_cert_file.empty() != options.tls_key_file.empty()) {
    return Fail(out,
                absl::InvalidArgumentError("flce-client: --tls-cert and --tls-key go together"),
                kExitUsage);
  }
  const std::string transport = merged.str("transport");
  if (transport == "auto") {
    options.transport = ClientOptions::Transport::kAuto;
  } else if (transport == "grpc") {
    options.transport = ClientOptions::Transport::kGrpc;
  } else if (transport == "shm") {
    options.transport = ClientOptions::Transport::kShm;
  } else {
    return Fail(out,
                absl::InvalidArgumentError(absl::StrCat(
                    "flce-client: --transport must be auto, grpc or shm; got \"", transport, "\"")),
                kExitUsage);
  }
  const std::string data_plane = merged.str("data-plane");
  if (data_plane == "auto") {
    options.data_plane = ClientOptions::DataPlane::kAuto;
  } else if (data_plane == "on") {
    options.data_plane = ClientOptions::DataPlane::kOn;
  } else if (data_plane == "off") {
    options.data_plane = ClientOptions::DataPlane::kOff;
  } else {
    return Fail(out,
                absl::InvalidArgumentError(absl::StrCat(
                    "flce-client: --data-plane must be auto, on or off; got \"", data_plane, "\"")),
                kExitUsage);
  }
  absl::StatusOr<std::string> token = AuthToken(merged);
  if (!token.ok()) return Fail(out, token.status(), kExitUsage);
  options.auth_token = *std::move(token);

  CliEnv env(options, err, err_is_terminal);
  absl::StatusOr<CommandResult> result = command->run(flags, env);
  if (!result.ok()) {
    return Fail(out, result.status(), IsUsageError(result.status()) ? kExitUsage : kExitFailed);
  }
  Print(out, result->json);
  return result->exit_code;
}

}  // namespace flce::cli
