// The logger's per-call-site rate limit, and libprotobuf's messages routed
// through it once a server has started: a peer sending strings that are not
// UTF-8 costs the log a bounded number of lines, not one per message.
#include "server/observe/log.h"

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "flce/v1/flce.pb.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "server/observe/log_rate_limiter.h"
#include "server/observe/request_log.h"
#include "tests/server/server_test_util.h"

namespace flce::server {
namespace {

// Lines the logger writes, instead of stderr, while it lives.
class CapturedLog {
 public:
  CapturedLog() {
    SetLogSink([this](absl::string_view line) {
      absl::MutexLock lock(&mu_);
      lines_.emplace_back(line);
    });
  }
  ~CapturedLog() { SetLogSink(nullptr); }

  std::vector<std::string> lines() const {
    absl::MutexLock lock(&mu_);
    return lines_;
  }
  int64_t Count(absl::string_view needle) const {
    int64_t n = 0;
    for (const std::string& line : lines()) n += absl::StrContains(line, needle) ? 1 : 0;
    return n;
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<std::string> lines_;
};

// A ComputeRequest whose header.head_id holds the bytes ff fe, built by hand:
// serializing such a message would itself log.
std::string NonUtf8Request() {
  // field 1 (header), 4 bytes: field 2 (head_id), 2 bytes: ff fe.
  return std::string("\x0a\x04\x12\x02\xff\xfe", 6);
}

class LogLimitTest : public ::testing::Test {
 protected:
  // Servers started by earlier tests in this process may have left info lines off.
  void SetUp() override { SetLogQuiet(false); }
  void TearDown() override { SetLogRateLimit(LogRateLimit{}); }
};

TEST(LogRateLimiterTest, WritesUpToTheLimitPerIntervalThenDrops) {
  LogRateLimiter limiter(LogRateLimit{3, absl::Seconds(10)});
  absl::Time t0 = absl::FromUnixSeconds(1000);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(limiter.Admit("a.cc:1", t0).write) << i;
  for (int i = 0; i < 5; ++i) EXPECT_FALSE(limiter.Admit("a.cc:1", t0 + absl::Seconds(9)).write);
  LogRateLimiter::Verdict next = limiter.Admit("a.cc:1", t0 + absl::Seconds(10));
  EXPECT_TRUE(next.write);
  EXPECT_EQ(next.suppressed, 5);
  EXPECT_EQ(next.suppressed_over, absl::Seconds(1));
  // Reported once: the following line carries no count.
  EXPECT_EQ(limiter.Admit("a.cc:1", t0 + absl::Seconds(10)).suppressed, 0);
}

TEST(LogRateLimiterTest, KeysHaveSeparateBudgets) {
  LogRateLimiter limiter(LogRateLimit{1, absl::Seconds(10)});
  absl::Time t0 = absl::FromUnixSeconds(1000);
  EXPECT_TRUE(limiter.Admit("a.cc:1", t0).write);
  EXPECT_FALSE(limiter.Admit("a.cc:1", t0).write);
  EXPECT_TRUE(limiter.Admit("a.cc:2", t0).write);
  EXPECT_TRUE(limiter.Admit("b.cc:1", t0).write);
}

TEST(LogRateLimiterTest, AClockSteppingBackStartsANewWindow) {
  LogRateLimiter limiter(LogRateLimit{1, absl::Seconds(10)});
  absl::Time t0 = absl::FromUnixSeconds(1000);
  EXPECT_TRUE(limiter.Admit("a.cc:1", t0).write);
  EXPECT_FALSE(limiter.Admit("a.cc:1", t0).write);
  EXPECT_TRUE(limiter.Admit("a.cc:1", t0 - absl::Seconds(3600)).write);
}

TEST(LogRateLimiterTest, NoLimitWritesEverything) {
  LogRateLimiter limiter(LogRateLimit{0, absl::Seconds(10)});
  for (int i = 0; i < 1000; ++i) ASSERT_TRUE(limiter.Admit("a.cc:1", absl::UnixEpoch()).write);
}

TEST_F(LogLimitTest, EachCallSiteIsLimitedAndReportsWhatItDropped) {
  SetLogRateLimit(LogRateLimit{5, absl::Seconds(1)});
  CapturedLog log;
  // Each lambda is one call site however often it runs.
  auto first = [] { LogError("first site"); };
  auto second = [] { LogError("second site"); };
  for (int i = 0; i < 100; ++i) {
    first();
    second();
  }
  EXPECT_EQ(log.Count("first site"), 5);
  EXPECT_EQ(log.Count("second site"), 5);
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  first();
  std::vector<std::string> lines = log.lines();
  ASSERT_EQ(lines.size(), 12u);
  EXPECT_TRUE(absl::StrContains(lines[10], "95 line(s) from log_test.cc:")) << lines[10];
  EXPECT_TRUE(absl::StrContains(lines[11], "first site")) << lines[11];
}

TEST_F(LogLimitTest, UnthrottledLinesAreAllWritten) {
  SetLogRateLimit(LogRateLimit{5, absl::Seconds(10)});
  CapturedLog log;
  for (int i = 0; i < 100; ++i) LogUnthrottled(LogLevel::kInfo, "request line");
  EXPECT_EQ(log.Count("request line"), 100);
}

TEST_F(LogLimitTest, ALongMessageIsCutAndSaysHowMuchWasLeftOut) {
  CapturedLog log;
  LogUnthrottled(LogLevel::kWarning, std::string(1 << 20, 'x'));
  std::vector<std::string> lines = log.lines();
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_LT(lines[0].size(), kMaxLogMessageBytes + 200);
  EXPECT_TRUE(absl::EndsWith(
      lines[0], absl::StrCat("x...(", (1 << 20) - kMaxLogMessageBytes, " more bytes)\n")))
      << lines[0].substr(lines[0].size() - 100);
}

// A client's ids reach the request line before they are validated: a
// megabyte-long one costs the log a few kilobytes, not a megabyte.
class RequestLineLengthTest : public test::ServerTest {
 protected:
  void TearDown() override {
    SetLogQuiet(false);
    test::ServerTest::TearDown();
  }
};

TEST_F(RequestLineLengthTest, AHugeRequestIdMakesOneShortLine) {
  StartServer(test::TestConfig());
  SetLogQuiet(false);  // the refusal's request line is at info level
  CapturedLog log;
  v1::ComputeHeader header;
  header.set_request_id(std::string(1 << 20, 'r'));
  header.set_head_id("no-such-head");
  header.set_num_tokens(1);
  test::ComputeOutcome out = test::ComputeMessages(stub(), {test::HeaderMessage(header)});
  EXPECT_EQ(out.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
      << out.status.error_message();
  // The line is written once the call is done, just after the client hears of it.
  std::vector<std::string> lines;
  for (int i = 0; i < 500 && lines.empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    for (const std::string& line : log.lines()) {
      if (absl::StrContains(line, "request id=")) lines.push_back(line);
    }
  }
  ASSERT_EQ(lines.size(), 1u);
  const std::string& line = lines[0];
  EXPECT_LT(line.size(), 2048u) << line.substr(0, 200);
  // Cut inside its value, the id leaves the rest of the line whole.
  EXPECT_TRUE(absl::StrContains(
      line, absl::StrCat("rrr...(", (1 << 20) - kMaxLogValueBytes, " more bytes)\" rpc=Compute")))
      << line;
  EXPECT_TRUE(absl::StrContains(line, "code=INVALID_ARGUMENT")) << line;
}

class ProtobufLogTest : public test::ServerTest {
 protected:
  void TearDown() override {
    SetLogRateLimit(LogRateLimit{});
    test::ServerTest::TearDown();
  }

  // Parses `n` requests whose head_id is not UTF-8; each one is refused and
  // makes libprotobuf log an error.
  static void ParseNonUtf8(int n) {
    const std::string bytes = NonUtf8Request();
    for (int i = 0; i < n; ++i) {
      v1::ComputeRequest request;
      ASSERT_FALSE(request.ParseFromString(bytes));
    }
  }
};

TEST_F(ProtobufLogTest, AThousandNonUtf8MessagesLogABoundedNumberOfLines) {
  StartServer(test::TestConfig());  // installs the handler
  // The default limit (20 lines per 10 s); the parses take far less than 10 s.
  SetLogRateLimit(LogRateLimit{});
  CapturedLog log;
  ParseNonUtf8(1000);
  std::vector<std::string> lines = log.lines();
  ASSERT_FALSE(lines.empty()) << "libprotobuf's errors do not reach the server's log";
  EXPECT_TRUE(absl::StrContains(lines[0], "libprotobuf: ")) << lines[0];
  EXPECT_TRUE(absl::StrContains(lines[0], "flce.v1.ComputeHeader.head_id")) << lines[0];
  // At most 20 lines, and one more if the loop straddled a window.
  EXPECT_LE(lines.size(), 21u);
}

// The same measurement without the limit: every message is a line, so the
// bound above is the limit's doing.
TEST_F(ProtobufLogTest, WithoutTheLimitEveryMessageIsALine) {
  StartServer(test::TestConfig());
  SetLogRateLimit(LogRateLimit{0, absl::Seconds(10)});
  CapturedLog log;
  ParseNonUtf8(1000);
  EXPECT_EQ(log.Count("flce.v1.ComputeHeader.head_id"), 1000);
}

// --log-format=json and --log-level.
class LogFormatTest : public test::ServerTest {
 protected:
  void TearDown() override {
    SetLogFormat(LogFormat::kText);
    SetLogLevel(LogLevel::kInfo);
    SetLogQuiet(false);
    test::ServerTest::TearDown();
  }
};

TEST_F(LogFormatTest, JsonLinesAreOneObjectEach) {
  SetLogFormat(LogFormat::kJson);
  CapturedLog log;
  LogUnthrottled(LogLevel::kWarning, "a \"quoted\" word\nand a second line \xff");
  std::vector<std::string> lines = log.lines();
  ASSERT_EQ(lines.size(), 1u);
  ASSERT_TRUE(absl::EndsWith(lines[0], "}\n")) << lines[0];
  EXPECT_EQ(std::count(lines[0].begin(), lines[0].end(), '\n'), 1) << "one line per record";
  nlohmann::json record = nlohmann::json::parse(lines[0]);
  EXPECT_EQ(record["level"], "warning");
  EXPECT_TRUE(absl::StartsWith(record["message"].get<std::string>(), "a \"quoted\" word\nand"));
  EXPECT_EQ(record["time"].get<std::string>().size(), 24u);  // 2026-12-01T13:15:44.123Z
}

TEST_F(LogFormatTest, AJsonRequestLineHasItsFields) {
  StartServer(test::TestConfig());
  SetLogQuiet(false);  // TestConfig's servers are quiet
  SetLogFormat(LogFormat::kJson);
  CapturedLog log;
  v1::DescribeHeadRequest request;
  request.set_head_id("no-such-head");
  v1::HeadInfo info;
  grpc::ClientContext ctx;
  ASSERT_EQ(stub().DescribeHead(&ctx, request, &info).error_code(), grpc::StatusCode::NOT_FOUND);
  nlohmann::json record;
  for (int i = 0; i < 500 && record.is_null(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    for (const std::string& line : log.lines()) {
      nlohmann::json parsed = nlohmann::json::parse(line, nullptr, false);
      ASSERT_FALSE(parsed.is_discarded()) << line;
      if (parsed.value("rpc", "") == "DescribeHead") record = parsed;
    }
  }
  ASSERT_FALSE(record.is_null());
  EXPECT_EQ(record["level"], "info");
  EXPECT_EQ(record["head"], "no-such-head");
  EXPECT_EQ(record["code"], "NOT_FOUND");
  EXPECT_TRUE(record["duration_ms"].is_number());
  EXPECT_TRUE(absl::StrContains(record["message"].get<std::string>(), "is not loaded"));
  EXPECT_TRUE(absl::StartsWith(record["request_id"].get<std::string>(), "#"));
}

TEST_F(LogFormatTest, LinesBelowTheLevelAreNotWritten) {
  CapturedLog log;
  SetLogLevel(LogLevel::kError);
  LogInfo("an info line");
  LogWarning("a warning line");
  LogUnthrottled(LogLevel::kWarning, "an unthrottled warning");
  LogError("an error line");
  std::vector<std::string> lines = log.lines();
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_TRUE(absl::StrContains(lines[0], "E flce-server: an error line")) << lines[0];
}

TEST(LogFlagsTest, NamesAreParsedAndOthersRefused) {
  EXPECT_EQ(*ParseLogLevel("warning"), LogLevel::kWarning);
  EXPECT_EQ(*ParseLogFormat("json"), LogFormat::kJson);
  absl::StatusOr<LogLevel> bad = ParseLogLevel("debug");
  EXPECT_EQ(bad.status().message(), "--log-level=debug is not one of info, warning, error");
  EXPECT_FALSE(ParseLogFormat("xml").ok());
}

}  // namespace
}  // namespace flce::server
