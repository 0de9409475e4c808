// What auth and tenants do to /metrics: refused calls are counted by code,
// tenants' heads add up under one flce_head_weight_bytes series whatever their
// ids, and neither tokens, tenant names nor their head ids become label values.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <memory>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/cpp/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/observe/log.h"
#include "tests/server/server_test_util.h"

namespace flce::server::test {
namespace {

using ::flce::test::MakeProblem;
using ::testing::HasSubstr;
using ::testing::Not;

// GET http://127.0.0.1:port/metrics, the body ("" on failure).
std::string Scrape(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return "";
  }
  std::string request = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  if (write(fd, request.data(), request.size()) != static_cast<ssize_t>(request.size())) {
    close(fd);
    return "";
  }
  std::string response;
  char buf[8192];
  for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;) response.append(buf, n);
  close(fd);
  size_t body = response.find("\r\n\r\n");
  return body == std::string::npos ? "" : response.substr(body + 4);
}


TEST(SecurityMetricsTest, RefusedCallsAreCountedAndNoTenantOrTokenIsALabel) {
#if defined(__SANITIZE_ADDRESS__)
  // civetweb (under prometheus-cpp) serves /metrics on threads with a fixed
  // 100 KiB stack, 60 KiB of which OpenBLAS's static TLS takes; with ASan's
  // larger frames the handler overflows the rest in this process.
  GTEST_SKIP() << "not under AddressSanitizer: civetweb's worker stacks are too small for it";
#endif
  SetLogQuiet(true);
  std::string tokens = ::testing::TempDir() + "/flce-metrics-tokens";
  std::ofstream(tokens) << "tok-alice-secret alice\ntok-bob-secret bob\n";
  ServerConfig config = TestConfig();
  config.metrics_port = FreePort();
  config.auth_token_file = tokens;
  config.sweep_interval = absl::Milliseconds(20);
  absl::StatusOr<std::unique_ptr<FlceServer>> server = FlceServer::Create(config);
  ASSERT_TRUE(server.ok()) << server.status();
  auto client = [&](const std::string& token) {
    ClientOptions options;
    options.target = absl::StrCat("127.0.0.1:", (*server)->port());
    options.timeout = absl::Seconds(20);
    options.auth_token = token;
    return *Client::Connect(options);
  };
  ProblemSpec spec;
  spec.vocab_size = 50;
  spec.hidden_size = 8;
  spec.seed = 3;
  Problem p = MakeProblem(spec);
  HeadUpload upload;
  upload.head_id = "h";
  upload.vocab_size = spec.vocab_size;
  upload.hidden_size = spec.hidden_size;
  upload.dtype = v1::DTYPE_FP32;
  upload.weight = p.weight_bytes;
  ASSERT_TRUE(client("tok-alice-secret")->UploadHead(upload).ok());
  ASSERT_TRUE(client("tok-bob-secret")->UploadHead(upload).ok());
  EXPECT_FALSE(client("tok-wrong")->GetServerInfo().ok());
  EXPECT_FALSE(client("")->ListHeads().ok());
  EXPECT_FALSE(client("tok-bob-secret")->DescribeHead("nope").ok());

  std::string text;
  for (int attempt = 0; attempt < 100; ++attempt) {
    text = Scrape((*server)->metrics_port());
    if (Sample(text, "flce_heads_loaded") == 2) break;
    usleep(20000);
  }
  EXPECT_EQ(Sample(text, "flce_heads_loaded"), 2) << text;
  EXPECT_EQ(Sample(text, "flce_head_weight_bytes{head=\"(tenant heads)\"}"), 2.0 * 50 * 8 * 4)
      << "two tenants' heads \"h\" add up";
  EXPECT_THAT(text, Not(HasSubstr("head=\"h\""))) << "a tenant's head id is a label value";
  EXPECT_EQ(Sample(text, "flce_requests_total{code=\"UNAUTHENTICATED\",rpc=\"GetServerInfo\"}"), 1);
  EXPECT_EQ(Sample(text, "flce_requests_total{code=\"UNAUTHENTICATED\",rpc=\"ListHeads\"}"), 1);
  EXPECT_EQ(Sample(text, "flce_requests_total{code=\"OK\",rpc=\"UploadHead\"}"), 2);
  EXPECT_EQ(Sample(text, "flce_requests_total{code=\"NOT_FOUND\",rpc=\"DescribeHead\"}"), 1);
  EXPECT_EQ(Sample(text, "flce_received_bytes_total{rpc=\"UploadHead\"}"), 2.0 * 50 * 8 * 4);
  EXPECT_THAT(text, Not(HasSubstr("tok-")));
  EXPECT_THAT(text, Not(HasSubstr("alice")));
  EXPECT_THAT(text, Not(HasSubstr("bob")));
  (*server)->Shutdown();
}

}  // namespace
}  // namespace flce::server::test
