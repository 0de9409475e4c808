#include "client/cli/flags.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace flce::cli {
namespace {

FlagSet MakeFlags() {
  FlagSet flags("compute", "test");
  flags.String("head", "head id").Required();
  flags.Int("ignore-index", "ignored target", "-100");
  flags.Double("scale", "scale", "1");
  flags.Bool("reset", "reset");
  flags.Choice("reduction", {"mean", "sum", "none"}, "mean", "reduction");
  flags.String("out", "output");
  return flags;
}

void ExpectError(const std::vector<std::string>& args, const std::string& part) {
  FlagSet flags = MakeFlags();
  absl::Status status = flags.Parse(args);
  ASSERT_FALSE(status.ok()) << "accepted: " << testing::PrintToString(args);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find(part), absl::string_view::npos) << status;
  EXPECT_NE(status.message().find("flce-client compute --help"), absl::string_view::npos);
}

TEST(FlagsTest, ParsesEveryForm) {
  FlagSet flags = MakeFlags();
  ASSERT_TRUE(flags
                  .Parse({"--head", "h1", "--ignore-index", "-1", "--scale=0.25", "--reset",
                          "--reduction", "sum"})
                  .ok());
  EXPECT_EQ(flags.str("head"), "h1");
  EXPECT_EQ(flags.i64("ignore-index"), -1);  // a negative value is a value, not a flag
  EXPECT_DOUBLE_EQ(flags.f64("scale"), 0.25);
  EXPECT_TRUE(flags.flag("reset"));
  EXPECT_EQ(flags.str("reduction"), "sum");
  EXPECT_FALSE(flags.has("out"));
  EXPECT_TRUE(flags.has("head"));
}

TEST(FlagsTest, DefaultsApplyWhenAbsent) {
  FlagSet flags = MakeFlags();
  ASSERT_TRUE(flags.Parse({"--head=h"}).ok());
  EXPECT_EQ(flags.i64("ignore-index"), -100);
  EXPECT_DOUBLE_EQ(flags.f64("scale"), 1.0);
  EXPECT_FALSE(flags.flag("reset"));
  EXPECT_EQ(flags.str("reduction"), "mean");
  EXPECT_EQ(flags.str("out"), "");
}

TEST(FlagsTest, BoolTakesExplicitValues) {
  FlagSet flags = MakeFlags();
  ASSERT_TRUE(flags.Parse({"--head=h", "--reset=false"}).ok());
  EXPECT_FALSE(flags.flag("reset"));
  ExpectError({"--head=h", "--reset=maybe"}, "true or false");
}

TEST(FlagsTest, RejectsBadCommandLines) {
  ExpectError({"--head", "h", "--bogus", "1"}, "unknown flag --bogus");
  ExpectError({"--head"}, "--head needs a value");
  ExpectError({"--head", "h", "--ignore-index", "x1"}, "wants an integer");
  ExpectError({"--head", "h", "--ignore-index", "1.5"}, "wants an integer");
  ExpectError({"--head", "h", "--scale", "fast"}, "wants a number");
  ExpectError({"--head", "h", "--reduction", "avg"}, "must be one of mean|sum|none");
  ExpectError({}, "missing required flag --head");
  ExpectError({"--head", "a", "--head", "b"}, "given twice");
  ExpectError({"--head", "h", "stray"}, "unexpected argument 'stray'");
}

TEST(FlagsTest, HelpWinsOverMissingRequiredFlags) {
  FlagSet flags = MakeFlags();
  ASSERT_TRUE(flags.Parse({"--help"}).ok());
  EXPECT_TRUE(flags.help());
  const std::string usage = flags.Usage();
  EXPECT_NE(usage.find("--head S"), std::string::npos);
  EXPECT_NE(usage.find("(required)"), std::string::npos);
  EXPECT_NE(usage.find("mean|sum|none"), std::string::npos);
}

TEST(FlagsTest, StopsAtTheSubcommand) {
  FlagSet global("", "tool");
  global.String("target", "address", "127.0.0.1:50051");
  std::vector<std::string> rest;
  ASSERT_TRUE(global.Parse({"--target", "h:1", "compute", "--head", "x"}, true, &rest).ok());
  EXPECT_EQ(global.str("target"), "h:1");
  EXPECT_EQ(rest, (std::vector<std::string>{"compute", "--head", "x"}));
}

}  // namespace
}  // namespace flce::cli
