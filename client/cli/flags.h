// A small command-line parser for flce-client: one FlagSet for the tool's
// global flags and one per subcommand. absl flags are process-global and
// cannot give two subcommands different flags of the same name, hence this.
// CLI11 (libcli11-dev 2.1.2) was tried in its place, keeping every message and the
// usage text: the project grew by 5 lines, the file compiled 5x slower, and CLI11 reads
// `--out= --reset` as out = "--reset"; so the parser stays.
//
// Accepted forms: --name value, --name=value, and --name alone for a boolean
// (or --name=true|false). Values are checked while parsing (numbers, choices,
// required flags), so the getters cannot fail.
//
// Usage:
//   FlagSet flags("compute", "Runs one compute call.");
//   flags.String("head", "head id").Required();
//   flags.Choice("reduction", {"mean", "sum", "none"}, "mean", "how to reduce");
//   FLCE_RETURN_IF_ERROR(flags.Parse(args));
//   if (flags.help()) { std::cout << flags.Usage(); ... }
//   std::string head = flags.str("head");
#ifndef FLCE_CLIENT_CLI_FLAGS_H_
#define FLCE_CLIENT_CLI_FLAGS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace flce::cli {

enum class FlagType { kString, kInt, kDouble, kBool, kChoice };

class FlagSet {
 public:
  // Returned by the declaring methods to chain Required().
  class Declared {
   public:
    explicit Declared(FlagSet& set, std::string name) : set_(set), name_(std::move(name)) {}
    Declared& Required();

   private:
    FlagSet& set_;
    std::string name_;
  };

  // command: "compute", or "" for the tool's global flags.
  FlagSet(std::string command, std::string summary);

  // default_value "" = no default (has() tells whether it was given).
  Declared String(const std::string& name, const std::string& help,
                  const std::string& default_value = "");
  Declared Int(const std::string& name, const std::string& help,
               const std::string& default_value = "");
  Declared Double(const std::string& name, const std::string& help,
                  const std::string& default_value = "");
  Declared Bool(const std::string& name, const std::string& help);
  Declared Choice(const std::string& name, const std::vector<std::string>& choices,
                  const std::string& default_value, const std::string& help);

  // Parses args (no program or command name). With stop_at_positional, the
  // first argument that is not a flag ends parsing and it and everything
  // after it go to *rest; otherwise a positional argument is an error.
  // INVALID_ARGUMENT names the problem and the --help to read.
  absl::Status Parse(const std::vector<std::string>& args, bool stop_at_positional = false,
                     std::vector<std::string>* rest = nullptr);

  bool help() const { return help_; }
  bool has(const std::string& name) const;  // given on the command line
  // The given value, else the default ("" / 0 / false when neither).
  std::string str(const std::string& name) const;
  int64_t i64(const std::string& name) const;
  double f64(const std::string& name) const;
  bool flag(const std::string& name) const;

  const std::string& command() const { return command_; }
  std::string Usage() const;

 private:
  struct Def {
    FlagType type;
    std::string help;
    std::string default_value;
    std::vector<std::string> choices;
    bool required = false;
  };
  Declared Declare(const std::string& name, Def def);
  const Def& Lookup(const std::string& name) const;
  absl::Status CheckValue(const std::string& name, const Def& def, const std::string& value) const;
  absl::Status Error(const std::string& message) const;
  std::string Value(const std::string& name) const;

  std::string command_;
  std::string summary_;
  std::vector<std::string> order_;  // declaration order, for Usage()
  std::map<std::string, Def> defs_;
  std::map<std::string, std::string> values_;
  bool help_ = false;
};

}  // namespace flce::cli

#endif  // FLCE_CLIENT_CLI_FLAGS_H_
