// What /metrics shows and where it listens: the exposer binds --metrics-host
// (by default the gRPC host), tenants' head ids never become label values,
// an unloaded head's series go away, and the build and process metrics are
// there. Scrapes read FlceServer::metrics_text() (the exposer's text) except
// where the listening socket itself is the point.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/cpp/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/held_rows.h"
#include "server/base/receive_buffers.h"
#include "server/observe/log.h"
#include "server/observe/process_metrics.h"
#include "tests/server/server_test_util.h"

namespace flce::server::test {
namespace {

using ::flce::test::MakeProblem;
using ::testing::HasSubstr;
using ::testing::Not;

// Whether a TCP connection to ip:port is accepted.
bool Accepts(const char* ip, int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, ip, &addr.sin_addr);
  bool ok = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  close(fd);
  return ok;
}

// GET http://ip:port/metrics, the body ("" on failure).
std::string Scrape(const char* ip, int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, ip, &addr.sin_addr);
  std::string response;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    std::string request = absl::StrCat("GET /metrics HTTP/1.0\r\nHost: ", ip, "\r\n\r\n");
    if (write(fd, request.data(), request.size()) == static_cast<ssize_t>(request.size())) {
      char buf[8192];
      for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;) response.append(buf, n);
    }
  }
  close(fd);
  size_t body = response.find("\r\n\r\n");
  return body == std::string::npos ? "" : response.substr(body + 4);
}


// The sum of flce_tokens_total over strategies for one head label; -1 when
// there is no such series.
double Tokens(const std::string& text, const std::string& head) {
  const std::string prefix = absl::StrCat("flce_tokens_total{head=\"", head, "\",");
  double sum = -1;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (!absl::StartsWith(line, prefix)) continue;
    double value = 0;
    if (!absl::SimpleAtod(line.substr(line.rfind(' ') + 1), &value)) continue;
    sum = (sum < 0 ? 0 : sum) + value;
  }
  return sum;
}

// 127.0.0.2 is loopback too (all of 127/8 is), but a socket bound to
// 127.0.0.1 does not accept on it: an exposer on 0.0.0.0 would.
TEST(MetricsHostTest, ExposerListensOnTheGrpcHostByDefault) {
  SetLogQuiet(true);
  ServerConfig config = TestConfig();  // gRPC on 127.0.0.1
  config.metrics_port = FreePort();
  absl::StatusOr<std::unique_ptr<FlceServer>> server = FlceServer::Create(config);
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_TRUE(Accepts("127.0.0.1", (*server)->metrics_port()));
  EXPECT_FALSE(Accepts("127.0.0.2", (*server)->metrics_port()))
      << "/metrics answers beyond the address --host names";
  (*server)->Shutdown();
}

TEST(MetricsHostTest, ExposerListensOnMetricsHost) {
  SetLogQuiet(true);
  ServerConfig config = TestConfig();
  config.metrics_port = FreePort();
  config.metrics_host = "127.0.0.2";
  absl::StatusOr<std::unique_ptr<FlceServer>> server = FlceServer::Create(config);
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_TRUE(Accepts("127.0.0.2", (*server)->metrics_port()));
  EXPECT_FALSE(Accepts("127.0.0.1", (*server)->metrics_port()));
  (*server)->Shutdown();
}

// IPv6 loopback for gRPC keeps /metrics on (IPv4) loopback: the exposer
// binds IPv4 only, and must neither fail the start nor open up to 0.0.0.0.
TEST(MetricsHostTest, Ipv6LoopbackMapsToIpv4Loopback) {
  SetLogQuiet(true);
  ServerConfig config = TestConfig();
  config.address = "[::1]:0";
  config.metrics_port = FreePort();
  absl::StatusOr<std::unique_ptr<FlceServer>> server = FlceServer::Create(config);
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_TRUE(Accepts("127.0.0.1", (*server)->metrics_port()));
  EXPECT_FALSE(Accepts("127.0.0.2", (*server)->metrics_port()));
  (*server)->Shutdown();
}

TEST(MetricsHostTest, AnAddressThatCannotBeBoundFailsTheStart) {
  SetLogQuiet(true);
  ServerConfig config = TestConfig();
  config.metrics_port = FreePort();
  config.metrics_host = "192.0.2.1";  // TEST-NET-1: no interface of this host has it
  absl::StatusOr<std::unique_ptr<FlceServer>> server = FlceServer::Create(config);
  ASSERT_FALSE(server.ok());
  EXPECT_THAT(server.status().message(), HasSubstr("192.0.2.1"));
}

TEST(MetricsHostTest, ServedTextHasTheProcessAndBuildMetrics) {
#if defined(__SANITIZE_ADDRESS__)
  // As in security_metrics_test.cc: civetweb's handler stacks are too small
  // for ASan's frames in this process.
  GTEST_SKIP() << "not under AddressSanitizer: civetweb's worker stacks are too small for it";
#endif
  SetLogQuiet(true);
  ServerConfig config = TestConfig();
  config.metrics_port = FreePort();
  absl::StatusOr<std::unique_ptr<FlceServer>> server = FlceServer::Create(config);
  ASSERT_TRUE(server.ok()) << server.status();
  std::string text = Scrape("127.0.0.1", (*server)->metrics_port());
  // The process collector is registered with the exposer apart from the registry.
  EXPECT_GT(Sample(text, "process_open_fds"), 0) << text;
  EXPECT_GT(Sample(text, "process_resident_memory_bytes"), 0) << text;
  EXPECT_THAT(text, HasSubstr("flce_build_info{"));
  EXPECT_THAT(text, HasSubstr("flce_workspace_peak_bytes "));
  EXPECT_THAT(text, Not(HasSubstr("flce_workspace_bytes_in_use")));
  (*server)->Shutdown();
}

TEST(ProcessMetricsTest, ParsesStatWithSpacesAndParenthesesInTheName) {
  // pid (comm) state ppid ... utime=14th stime=15th ... starttime=22nd.
  const std::string stat =
      "4242 (a) b (c)) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 3 0 123400 "
      "1000 200 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0\n";
  std::optional<ProcStat> parsed = ParseProcStat(stat, 100);
  ASSERT_TRUE(parsed.has_value());
  EXPECT_DOUBLE_EQ(parsed->cpu_seconds, 3.0);
  EXPECT_DOUBLE_EQ(parsed->start_after_boot_s, 1234.0);
  EXPECT_FALSE(ParseProcStat("4242 (short) S 1 2 3", 100).has_value());
  EXPECT_FALSE(ParseProcStat("no parenthesis", 100).has_value());
}

TEST(ProcessMetricsTest, ThisProcessValuesAreSane) {
  SetLogQuiet(true);
  ServerConfig config = TestConfig();
  absl::StatusOr<std::unique_ptr<FlceServer>> server = FlceServer::Create(config);
  ASSERT_TRUE(server.ok()) << server.status();
  // Some CPU time, so that a broken field index (reading 0 or garbage) shows.
  volatile double sink = 0;
  for (int i = 0; i < 20000000; ++i) sink = sink + i * 1e-9;
  std::string text = (*server)->metrics_text();
  const double now = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
  const double start = Sample(text, "process_start_time_seconds");
  EXPECT_GT(start, now - 24 * 3600) << text;  // a test process is younger than a day
  EXPECT_LE(start, now + 2) << text;
  const double cpu = Sample(text, "process_cpu_seconds_total");
  EXPECT_GT(cpu, 0) << text;
  EXPECT_LT(cpu, 24 * 3600 * 1024.0) << text;
  // This process maps its own binary, gRPC and an engine: more than 1 MiB.
  EXPECT_GT(Sample(text, "process_resident_memory_bytes"), 1 << 20) << text;
  // The listening socket at least, besides stdin/stdout/stderr.
  EXPECT_GT(Sample(text, "process_open_fds"), 3) << text;
  (*server)->Shutdown();
}

class MetricsLabelsTest : public ServerTest {
 protected:
  void SetUp() override {
    SetLogQuiet(true);
    tokens_ = std::filesystem::temp_directory_path() /
              absl::StrCat("flce-metrics-labels-", getpid(), "-", counter_++);
    std::ofstream(tokens_) << "tok-alice alice\ntok-ops ops admin\n";
  }
  void TearDown() override {
    ServerTest::TearDown();
    std::error_code ignored;
    std::filesystem::remove(tokens_, ignored);
  }

  std::unique_ptr<Client> As(const std::string& token) {
    ClientOptions options;
    options.target = absl::StrCat("127.0.0.1:", server().port());
    options.timeout = absl::Seconds(20);
    options.auth_token = token;
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? *std::move(client) : nullptr;
  }

  // Uploads p as head_id and computes on it once.
  void UploadAndCompute(Client& client, const Problem& p, const std::string& head_id) {
    HeadUpload upload;
    upload.head_id = head_id;
    upload.vocab_size = p.spec.vocab_size;
    upload.hidden_size = p.spec.hidden_size;
    upload.dtype = v1::DTYPE_FP32;
    upload.weight = p.weight_bytes;
    ASSERT_TRUE(client.UploadHead(upload).ok());
    ComputeArgs args;
    args.header.set_head_id(head_id);
    args.header.set_session_id("s");
    args.header.set_hidden_dtype(v1::DTYPE_FP32);
    args.header.set_reduction(v1::REDUCTION_SUM);
    args.targets = p.targets;
    args.hidden = p.hidden_bytes;
    absl::StatusOr<flce::ComputeOutcome> out = client.Compute(args);
    ASSERT_TRUE(out.ok()) << out.status();
  }

  // metrics_text() once the sweeper's gauges satisfy `done` (up to 5 s).
  std::string TextWhen(const std::function<bool(const std::string&)>& done) {
    std::string text;
    for (int attempt = 0; attempt < 250; ++attempt) {
      text = server().metrics_text();
      if (done(text)) break;
      usleep(20000);
    }
    return text;
  }

  std::filesystem::path tokens_;
  static inline int counter_ = 0;
};

TEST_F(MetricsLabelsTest, TenantHeadIdsAreNotLabelsAndUnloadedHeadsLeaveNoSeries) {
  ServerConfig config = TestConfig();
  config.auth_token_file = tokens_.string();
  config.sweep_interval = absl::Milliseconds(20);
  StartServer(config);
  ProblemSpec spec;
  spec.vocab_size = 50;
  spec.hidden_size = 8;
  spec.num_tokens = 12;
  Problem p = MakeProblem(spec);
  const double head_bytes = 50.0 * 8 * 4;
  std::unique_ptr<Client> alice = As("tok-alice");
  std::unique_ptr<Client> ops = As("tok-ops");
  ASSERT_TRUE(alice && ops);
  UploadAndCompute(*alice, p, "alice-private-7f3a");
  UploadAndCompute(*ops, p, "shared-lm");
  // A tenant computing on the shared head counts under the shared id.
  ComputeArgs args;
  args.header.set_head_id("shared-lm");
  args.header.set_session_id("s");
  args.header.set_hidden_dtype(v1::DTYPE_FP32);
  args.header.set_reduction(v1::REDUCTION_SUM);
  args.targets = p.targets;
  args.hidden = p.hidden_bytes;
  ASSERT_TRUE(alice->Compute(args).ok());

  std::string text = TextWhen([](const std::string& t) {
    return Sample(t, "flce_heads_loaded") == 2 &&
           Sample(t, "flce_head_weight_bytes{head=\"(tenant heads)\"}") > 0;
  });
  EXPECT_THAT(text, Not(HasSubstr("alice-private"))) << "a tenant's head id is a label value";
  EXPECT_EQ(Sample(text, "flce_head_weight_bytes{head=\"(tenant heads)\"}"), head_bytes) << text;
  EXPECT_EQ(Sample(text, "flce_head_weight_bytes{head=\"shared-lm\"}"), head_bytes) << text;
  EXPECT_EQ(Tokens(text, "(tenant heads)"), 12) << text;
  EXPECT_EQ(Tokens(text, "shared-lm"), 24) << text;

  // Unloading the shared head removes its counters at once (its weight gauge
  // too, though a sweep that listed the heads just before the unload may put
  // that back until the next one).
  ASSERT_TRUE(ops->UnloadHead("shared-lm").ok());
  text = server().metrics_text();
  EXPECT_EQ(Tokens(text, "shared-lm"), -1) << text;
  text = TextWhen([](const std::string& t) { return Sample(t, "flce_heads_loaded") == 1; });
  EXPECT_THAT(text, Not(HasSubstr("head=\"shared-lm\""))) << text;
  EXPECT_EQ(Tokens(text, "(tenant heads)"), 12) << "another head's series went too";

  // The last tenant head gone, the aggregate goes at the next sweep.
  ASSERT_TRUE(alice->UnloadHead("alice-private-7f3a").ok());
  text = TextWhen([](const std::string& t) {
    return Sample(t, "flce_heads_loaded") == 0 && t.find("(tenant heads)") == std::string::npos;
  });
  EXPECT_EQ(Sample(text, "flce_heads_loaded"), 0) << text;
  EXPECT_THAT(text, Not(HasSubstr("flce_tokens_total{"))) << "series outlive their heads";
  EXPECT_THAT(text, Not(HasSubstr("flce_head_weight_bytes{"))) << text;
}

// The data plane's kept frame buffers are memory the process holds between
// calls too: a gauge of the shared pool's bytes.
TEST_F(MetricsLabelsTest, ReceiveBuffersKeptForTheNextFramesAreAGauge) {
  ServerConfig config = TestConfig();
  config.sweep_interval = absl::Milliseconds(20);
  StartServer(config);
  ReceiveBuffers& shared = ReceiveBuffers::Shared();
  std::string frame = shared.Take(size_t{1} << 20);
  const int64_t before = static_cast<int64_t>(shared.kept_bytes());
  shared.Return(std::move(frame));
  const int64_t kept = static_cast<int64_t>(shared.kept_bytes());
  ASSERT_GT(kept, before) << "the pool is full: its cap is " << ReceiveBuffers::kMaxKeptBytes;
  std::string text = TextWhen([&](const std::string& t) {
    return Sample(t, "flce_receive_buffers_kept_bytes") == kept;
  });
  EXPECT_EQ(Sample(text, "flce_receive_buffers_kept_bytes"), kept) << text;
}

// Preference calls keep their host rows' buffers for the next calls: memory
// the process holds with no call in progress, which an operator should see.
TEST_F(MetricsLabelsTest, HeldRowsKeptForTheNextCallsAreAGauge) {
  HeldRows::DropKept();
  ServerConfig config = TestConfig();
  config.sweep_interval = absl::Milliseconds(20);
  StartServer(config);
  std::string text = TextWhen(
      [](const std::string& t) { return Sample(t, "flce_held_rows_kept_bytes") == 0; });
  EXPECT_EQ(Sample(text, "flce_held_rows_kept_bytes"), 0) << text;
  { HeldRows rows(3 << 20); }  // a call's rows, back to the kept ones at its end
  text = TextWhen([](const std::string& t) {
    return Sample(t, "flce_held_rows_kept_bytes") == (3 << 20);
  });
  EXPECT_EQ(Sample(text, "flce_held_rows_kept_bytes"), 3 << 20) << text;
  HeldRows::DropKept();
  text = TextWhen(
      [](const std::string& t) { return Sample(t, "flce_held_rows_kept_bytes") == 0; });
  EXPECT_EQ(Sample(text, "flce_held_rows_kept_bytes"), 0) << text;
}

TEST_F(MetricsLabelsTest, BuildInfoNamesTheVersionTheServerReports) {
  StartServer(TestConfig());
  std::unique_ptr<Client> client = As("");
  ASSERT_TRUE(client);
  absl::StatusOr<v1::ServerInfo> info = client->GetServerInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  std::string text = server().metrics_text();
  size_t at = text.find("\nflce_build_info{");
  ASSERT_NE(at, std::string::npos) << text;
  std::string line = text.substr(at + 1, text.find('\n', at + 1) - at - 1);
  EXPECT_THAT(line, HasSubstr(absl::StrCat("version=\"", info->version(), "\"")));
  // A short hash in a checkout, "unknown" outside one: never empty.
  EXPECT_THAT(line, Not(HasSubstr("commit=\"\"")));
  EXPECT_THAT(line, HasSubstr("commit=\""));
  EXPECT_TRUE(absl::EndsWith(line, "} 1")) << line;
}

}  // namespace
}  // namespace flce::server::test
