// flce-client's command line run in-process, with no server: every usage
// error must print one JSON error object and exit 2 before any connection is
// tried, and local failures (unreadable files) exit 1 with their status.
#include <unistd.h>

#include <sstream>
#include <string>
#include <vector>

#include "client/cli/cli_main.h"
#include "client/cli/command.h"
#include "client/cpp/npy.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace flce::cli {
namespace {

struct CliOutput {
  int exit_code;
  std::string out;
  std::string err;
};

CliOutput RunArgs(const std::vector<std::string>& args) {
  std::ostringstream out, err;
  // A port nobody listens on: a test that reaches the network fails fast.
  std::vector<std::string> full = {"--target", "127.0.0.1:1", "--timeout-s", "5"};
  full.insert(full.end(), args.begin(), args.end());
  const int code = RunCli(full, out, err, /*err_is_terminal=*/false);
  return {code, out.str(), err.str()};
}

// The whole of stdout must be exactly one JSON object.
nlohmann::json OneObject(const std::string& out) {
  nlohmann::json json = nlohmann::json::parse(out, nullptr, /*allow_exceptions=*/false);
  EXPECT_TRUE(json.is_object()) << out;
  return json;
}

void ExpectUsageError(const std::vector<std::string>& args, const std::string& part) {
  const CliOutput run = RunArgs(args);
  EXPECT_EQ(run.exit_code, 2) << run.out;
  const nlohmann::json json = OneObject(run.out);
  ASSERT_TRUE(json.contains("error")) << run.out;
  EXPECT_EQ(json["error"]["code"], "INVALID_ARGUMENT");
  EXPECT_NE(json["error"]["message"].get<std::string>().find(part), std::string::npos) << run.out;
  EXPECT_EQ(run.out.find('\n'), run.out.size() - 1) << "more than one line: " << run.out;
}

TEST(CliUsageTest, UsageErrorsExit2WithOneJsonObject) {
  ExpectUsageError({}, "no subcommand");
  ExpectUsageError({"frobnicate"}, "unknown subcommand 'frobnicate'");
  ExpectUsageError({"compute", "--head", "h"}, "missing required flag --session");
  ExpectUsageError({"compute", "--head", "h", "--session", "s", "--hidden", "h.npy", "--targets",
                    "t.npy", "--reduction", "avg"},
                   "mean|sum|none");
  ExpectUsageError({"compute", "--head", "h", "--session", "s", "--hidden", "h.npy", "--targets",
                    "t.npy", "--chunk-mb", "0"},
                   "--chunk-mb must be > 0");
  ExpectUsageError({"load-weight", "--head", "h", "--weight", "w.npy", "--dtype", "fp64"},
                   "bf16|fp16|fp32");
  ExpectUsageError({"fetch-grad", "--head", "h", "--session", "s"}, "--out");
  ExpectUsageError(
      {"fetch-grad", "--head", "h", "--session", "s", "--out", "g.npy", "--dtype", "fp16"},
      "fp32|bf16");
  ExpectUsageError({"sessions", "--delete", "--head", "h"}, "--delete needs --head and --session");
  ExpectUsageError(
      {"commit", "--head", "h", "--session", "s", "--request-id", "r", "--scale", "half"},
      "wants a number");
  ExpectUsageError({"bench", "--steps", "0"}, "--steps must be >= 1");
  ExpectUsageError({"list-heads", "extra"}, "unexpected argument 'extra'");
}

TEST(CliUsageTest, GlobalFlagErrorsExit2) {
  std::ostringstream out, err;
  EXPECT_EQ(RunCli({"--max-message-mb", "0", "list-heads"}, out, err, false), 2);
  EXPECT_EQ(OneObject(out.str())["error"]["code"], "INVALID_ARGUMENT");
  std::ostringstream out_connections;
  EXPECT_EQ(RunCli({"--connections", "10", "list-heads"}, out_connections, err, false), 2);
  EXPECT_NE(out_connections.str().find("--connections must be in [1, 9]"), std::string::npos)
      << out_connections.str();
  std::ostringstream out2;
  EXPECT_EQ(RunCli({"--timeout-s", "-1", "health"}, out2, err, false), 2);
  std::ostringstream out3;
  EXPECT_EQ(RunCli({"--port", "1", "health"}, out3, err, false), 2);
  EXPECT_NE(out3.str().find("unknown flag --port"), std::string::npos);
}

TEST(CliUsageTest, GlobalFlagsMayFollowTheSubcommandButNotTwice) {
  std::ostringstream out, err;
  EXPECT_EQ(RunCli({"list-heads", "--target", "127.0.0.1:1", "--timeout-s", "5"}, out, err, false),
            1);
  EXPECT_EQ(OneObject(out.str())["error"]["code"], "UNAVAILABLE") << out.str();
  std::ostringstream twice;
  EXPECT_EQ(RunCli({"--target", "127.0.0.1:1", "list-heads", "--target", "127.0.0.1:2"}, twice, err,
                   false),
            2);
  EXPECT_NE(twice.str().find("given both before and after"), std::string::npos) << twice.str();
}

TEST(CliUsageTest, HelpForTheToolAndEverySubcommand) {
  std::ostringstream out, err;
  ASSERT_EQ(RunCli({"--help"}, out, err, false), 0);
  std::vector<std::string> subcommands;
  for (const Command& command : Commands()) subcommands.push_back(command.name);
  EXPECT_GE(subcommands.size(), 13u);
  for (const std::string& name : subcommands) {
    // The whole name, then at least two spaces before its summary.
    EXPECT_NE(out.str().find("\n  " + name + "  "), std::string::npos) << name << "\n"
                                                                     << out.str();
    std::ostringstream sub_out;
    EXPECT_EQ(RunCli({name, "--help"}, sub_out, err, false), 0) << name;
    EXPECT_NE(sub_out.str().find("usage: flce-client [global flags] " + name), std::string::npos)
        << sub_out.str();
  }
}

// The names come from the proto's Strategy enum.
TEST(CliUsageTest, ComputeOffersEveryStrategyOfTheProto) {
  std::ostringstream out, err;
  ASSERT_EQ(RunCli({"compute", "--help"}, out, err, false), 0);
  for (const char* name : {"auto", "chunked", "vocab_split", "fuse_mn", "separate", "naive"}) {
    EXPECT_NE(out.str().find(name), std::string::npos) << name << "\n" << out.str();
  }
  std::ostringstream bad;
  EXPECT_EQ(RunCli({"compute", "--strategy", "STRATEGY_CHUNKED", "--head", "h", "--hidden", "x",
                    "--targets", "y"},
                   bad, err, false),
            2);
}

TEST(CliUsageTest, UnreadableInputsFailWithTheirStatus) {
  const CliOutput run = RunArgs({"compute", "--head", "h", "--session", "s", "--hidden",
                                 "/nonexistent/h.npy", "--targets", "/nonexistent/t.npy"});
  EXPECT_EQ(run.exit_code, 1);
  const nlohmann::json json = OneObject(run.out);
  EXPECT_EQ(json["error"]["code"], "NOT_FOUND");
  EXPECT_NE(json["error"]["message"].get<std::string>().find("/nonexistent/h.npy"),
            std::string::npos);
}

TEST(CliUsageTest, AnUnreachableServerIsAFailedCall) {
  const CliOutput run = RunArgs({"list-heads"});
  EXPECT_EQ(run.exit_code, 1);
  EXPECT_EQ(OneObject(run.out)["error"]["code"], "UNAVAILABLE");
}

TEST(CliUsageTest, MismatchedTargetsFailBeforeAnyCall) {
  char dir[] = "/tmp/flce_cli_usage_XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string h = std::string(dir) + "/h.npy", t = std::string(dir) + "/t.npy";
  ASSERT_TRUE(WriteNpy(h, NpyArray{NpyType::kF32, {3, 2}, std::string(24, '\0')}).ok());
  ASSERT_TRUE(WriteNpy(t, NpyArray{NpyType::kI32, {2}, std::string(8, '\0')}).ok());
  const CliOutput run =
      RunArgs({"compute", "--head", "x", "--session", "s", "--hidden", h, "--targets", t});
  EXPECT_EQ(run.exit_code, 1);
  const nlohmann::json json = OneObject(run.out);
  EXPECT_EQ(json["error"]["code"], "INVALID_ARGUMENT");
  EXPECT_NE(json["error"]["message"].get<std::string>().find("has 2 targets but"),
            std::string::npos)
      << run.out;
  std::remove(h.c_str());
  std::remove(t.c_str());
  rmdir(dir);
}

}  // namespace
}  // namespace flce::cli
