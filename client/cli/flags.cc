#include "client/cli/flags.h"

#include <cstdio>
#include <cstdlib>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace flce::cli {

FlagSet::Declared& FlagSet::Declared::Required() {
  set_.defs_.at(name_).required = true;
  return *this;
}

FlagSet::FlagSet(std::string command, std::string summary)
    : command_(std::move(command)), summary_(std::move(summary)) {}

FlagSet::Declared FlagSet::Declare(const std::string& name, Def def) {
  if (!defs_.emplace(name, std::move(def)).second) {
    // Two declarations of one name are a bug in flce-client itself.
    std::fprintf(stderr, "flce-client: flag --%s declared twice\n", name.c_str());
    std::abort();
  }
  order_.push_back(name);
  return Declared(*this, name);
}

FlagSet::Declared FlagSet::String(const std::string& name, const std::string& help,
                                  const std::string& default_value) {
  return Declare(name, Def{FlagType::kString, help, default_value, {}});
}

FlagSet::Declared FlagSet::Int(const std::string& name, const std::string& help,
                               const std::string& default_value) {
  return Declare(name, Def{FlagType::kInt, help, default_value, {}});
}

FlagSet::Declared FlagSet::Double(const std::string& name, const std::string& help,
                                  const std::string& default_value) {
  return Declare(name, Def{FlagType::kDouble, help, default_value, {}});
}

FlagSet::Declared FlagSet::Bool(const std::string& name, const std::string& help) {
  return Declare(name, Def{FlagType::kBool, help, "false", {}});
}

FlagSet::Declared FlagSet::Choice(const std::string& name, const std::vector<std::string>& choices,
                                  const std::string& default_value, const std::string& help) {
  return Declare(name, Def{FlagType::kChoice, help, default_value, choices});
}

absl::Status FlagSet::Error(const std::string& message) const {
  const std::string where = command_.empty() ? "flce-client" : "flce-client " + command_;
  return absl::InvalidArgumentError(
      absl::StrCat(where, ": ", message, " (see ", where, " --help)"));
}

absl::Status FlagSet::CheckValue(const std::string& name, const Def& def,
                                 const std::string& value) const {
  switch (def.type) {
    case FlagType::kString:
      return absl::OkStatus();
    case FlagType::kInt: {
      int64_t parsed;
      if (!absl::SimpleAtoi(value, &parsed)) {
        return Error(absl::StrCat("--", name, " wants an integer, got '", value, "'"));
      }
      return absl::OkStatus();
    }
    case FlagType::kDouble: {
      double parsed;
      if (!absl::SimpleAtod(value, &parsed)) {
        return Error(absl::StrCat("--", name, " wants a number, got '", value, "'"));
      }
      return absl::OkStatus();
    }
    case FlagType::kBool:
      if (value != "true" && value != "false") {
        return Error(absl::StrCat("--", name, " is true or false, got '", value, "'"));
      }
      return absl::OkStatus();
    case FlagType::kChoice:
      for (const std::string& choice : def.choices) {
        if (value == choice) return absl::OkStatus();
      }
      return Error(absl::StrCat("--", name, " must be one of ", absl::StrJoin(def.choices, "|"),
                                ", got '", value, "'"));
  }
  return absl::OkStatus();
}

absl::Status FlagSet::Parse(const std::vector<std::string>& args, bool stop_at_positional,
                            std::vector<std::string>* rest) {
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--help" || arg == "-h") {
      help_ = true;
      continue;
    }
    if (!absl::StartsWith(arg, "--") || arg == "--") {
      if (stop_at_positional && rest != nullptr) {
        rest->assign(args.begin() + i, args.end());
        break;
      }
      return Error(absl::StrCat("unexpected argument '", arg, "'"));
    }
    std::string name = arg.substr(2);
    std::string value;
    bool inline_value = false;
    if (const size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      inline_value = true;
    }
    const auto def = defs_.find(name);
    if (def == defs_.end()) return Error(absl::StrCat("unknown flag --", name));
    if (!inline_value) {
      if (def->second.type == FlagType::kBool) {
        value = "true";
      } else if (i + 1 < args.size()) {
        value = args[++i];  // taken as is: "--ignore-index -1" is a value
      } else {
        return Error(absl::StrCat("--", name, " needs a value"));
      }
    }
    if (absl::Status s = CheckValue(name, def->second, value); !s.ok()) return s;
    if (values_.count(name) && def->second.type != FlagType::kBool) {
      return Error(absl::StrCat("--", name, " given twice"));
    }
    values_[name] = value;
  }
  if (help_) return absl::OkStatus();  // --help wins over missing flags
  for (const std::string& name : order_) {
    if (defs_.at(name).required && !values_.count(name)) {
      return Error(absl::StrCat("missing required flag --", name));
    }
  }
  return absl::OkStatus();
}

const FlagSet::Def& FlagSet::Lookup(const std::string& name) const {
  const auto it = defs_.find(name);
  if (it == defs_.end()) {
    std::fprintf(stderr, "flce-client: flag --%s read but never declared\n", name.c_str());
    std::abort();
  }
  return it->second;
}

bool FlagSet::has(const std::string& name) const {
  Lookup(name);
  return values_.count(name) > 0;
}

std::string FlagSet::Value(const std::string& name) const {
  const Def& def = Lookup(name);
  const auto it = values_.find(name);
  return it != values_.end() ? it->second : def.default_value;
}

std::string FlagSet::str(const std::string& name) const { return Value(name); }

int64_t FlagSet::i64(const std::string& name) const {
  int64_t value = 0;
  const std::string text = Value(name);
  if (!text.empty() && !absl::SimpleAtoi(text, &value)) value = 0;
  return value;
}

double FlagSet::f64(const std::string& name) const {
  double value = 0;
  const std::string text = Value(name);
  if (!text.empty() && !absl::SimpleAtod(text, &value)) value = 0;
  return value;
}

bool FlagSet::flag(const std::string& name) const { return Value(name) == "true"; }

std::string FlagSet::Usage() const {
  std::string out =
      command_.empty() ? "usage: flce-client [global flags] SUBCOMMAND [flags]\n"
                       : absl::StrCat("usage: flce-client [global flags] ", command_, " [flags]\n");
  absl::StrAppend(&out, "\n", summary_, "\n\nflags:\n");
  for (const std::string& name : order_) {
    const Def& def = defs_.at(name);
    std::string left = "--" + name;
    switch (def.type) {
      case FlagType::kString:
        left += " S";
        break;
      case FlagType::kInt:
        left += " N";
        break;
      case FlagType::kDouble:
        left += " X";
        break;
      case FlagType::kBool:
        break;
      case FlagType::kChoice:
        left += " " + absl::StrJoin(def.choices, "|");
        break;
    }
    std::string right = def.help;
    if (def.required) {
      right += " (required)";
    } else if (def.type != FlagType::kBool && !def.default_value.empty()) {
      absl::StrAppend(&right, " (default ", def.default_value, ")");
    }
    absl::StrAppend(&out, "  ", left);
    if (left.size() < 28) {
      out.append(28 - left.size(), ' ');
    } else {
      out += "\n" + std::string(30, ' ');
    }
    absl::StrAppend(&out, right, "\n");
  }
  absl::StrAppend(&out, "  --help", std::string(22, ' '), "this text\n");
  return out;
}

}  // namespace flce::cli
