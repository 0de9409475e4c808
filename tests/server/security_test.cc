// Token auth, tenants, TLS / mutual TLS and the server's limits, through the
// C++ client library (flce::Client) against an in-process server.
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/cpp/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/state/head_registry.h"
#include "tests/server/server_test_util.h"
#include "tests/server/test_certs.h"

namespace flce::server::test {
namespace {

using ::flce::test::MakeProblem;
using ::flce::test::TestCerts;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kTokens[] =
    "# flce tokens: token tenant [admin]\n"
    "tok-alice alice\n"
    "\n"
    "tok-bob   bob   # a comment after the entry\n"
    "tok-admin ops admin\n";

Problem SmallProblem() {
  ProblemSpec spec;
  spec.vocab_size = 97;
  spec.hidden_size = 16;
  spec.num_tokens = 24;
  spec.seed = 7;
  return MakeProblem(spec);
}

HeadUpload UploadOf(const Problem& p, const std::string& head_id) {
  HeadUpload upload;
  upload.head_id = head_id;
  upload.vocab_size = p.spec.vocab_size;
  upload.hidden_size = p.spec.hidden_size;
  upload.dtype = v1::DTYPE_FP32;
  upload.weight = p.weight_bytes;
  return upload;
}

ComputeArgs ComputeOf(const Problem& p, const std::string& head_id, const std::string& session) {
  ComputeArgs args;
  args.header.set_head_id(head_id);
  args.header.set_session_id(session);
  args.header.set_hidden_dtype(v1::DTYPE_FP32);
  args.header.set_reduction(v1::REDUCTION_SUM);
  args.targets = p.targets;
  args.hidden = p.hidden_bytes;
  return args;
}

std::vector<float> Floats(const std::string& bytes) {
  std::vector<float> out(bytes.size() / sizeof(float));
  std::memcpy(out.data(), bytes.data(), out.size() * sizeof(float));
  return out;
}

class SecurityTest : public ServerTest {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           absl::StrCat("flce-security-", getpid(), "-", counter_++);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override {
    ServerTest::TearDown();
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }

  std::string WriteFile(const std::string& name, const std::string& text) {
    std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
    return path;
  }

  ServerConfig AuthConfig() {
    ServerConfig config = TestConfig();
    config.auth_token_file = WriteFile("tokens", kTokens);
    return config;
  }

  // A client of the running server; `options` gives TLS settings.
  std::unique_ptr<Client> As(const std::string& token, ClientOptions options = {}) {
    options.target = absl::StrCat("127.0.0.1:", server().port());
    options.timeout = absl::Seconds(20);
    options.auth_token = token;
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? *std::move(client) : nullptr;
  }

  std::filesystem::path dir_;
  static inline int counter_ = 0;
};

// --- auth -------------------------------------------------------------------

TEST_F(SecurityTest, CallsNeedAValidBearerTokenAndHealthStaysOpen) {
  StartServer(AuthConfig());
  Problem p = SmallProblem();
  for (const std::string& token : {std::string(), std::string("tok-wrong-secret")}) {
    std::unique_ptr<Client> client = As(token);
    absl::StatusOr<v1::ServerInfo> info = client->GetServerInfo();
    ASSERT_EQ(info.status().code(), absl::StatusCode::kUnauthenticated) << info.status();
    EXPECT_THAT(std::string(info.status().message()), Not(HasSubstr("tok-")));
    // Streaming calls are refused at the same gate.
    EXPECT_EQ(client->UploadHead(UploadOf(p, "h")).status().code(),
              absl::StatusCode::kUnauthenticated);
    EXPECT_EQ(client->Compute(ComputeOf(p, "h", "s")).status().code(),
              absl::StatusCode::kUnauthenticated);
    EXPECT_EQ(client->FetchGrad({"h", "s"}).status().code(), absl::StatusCode::kUnauthenticated);
    EXPECT_EQ(client->ListHeads().status().code(), absl::StatusCode::kUnauthenticated);
    absl::StatusOr<HealthStatus> health = client->Health();
    ASSERT_TRUE(health.ok()) << health.status();
    EXPECT_EQ(*health, HealthStatus::kServing);
  }
  std::unique_ptr<Client> alice = As("tok-alice");
  ASSERT_TRUE(alice->GetServerInfo().ok());
  ASSERT_TRUE(alice->UploadHead(UploadOf(p, "h")).ok());
  absl::StatusOr<flce::ComputeOutcome> out = alice->Compute(ComputeOf(p, "h", "s"));
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_TRUE(out->summary.committed());
}

TEST_F(SecurityTest, ReloadPicksUpNewTokensAndDropsRemovedOnes) {
  ServerConfig config = AuthConfig();
  StartServer(config);
  ASSERT_TRUE(As("tok-alice")->GetServerInfo().ok());
  WriteFile("tokens", "tok-carol carol\n");
  ASSERT_TRUE(server().ReloadAuth().ok());
  EXPECT_EQ(As("tok-alice")->GetServerInfo().status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_TRUE(As("tok-carol")->GetServerInfo().ok());
  // A broken file is refused and the tokens in force stay.
  WriteFile("tokens", "tok-dave\n");
  absl::Status reload = server().ReloadAuth();
  EXPECT_EQ(reload.code(), absl::StatusCode::kInvalidArgument) << reload;
  EXPECT_THAT(std::string(reload.message()), HasSubstr(":1:"));
  EXPECT_THAT(std::string(reload.message()), Not(HasSubstr("tok-dave")));
  EXPECT_TRUE(As("tok-carol")->GetServerInfo().ok());
}

// --- tenants ----------------------------------------------------------------

TEST_F(SecurityTest, ATenantCannotSeeOrTouchAnothersHeadsAndSessions) {
  StartServer(AuthConfig());
  Problem p = SmallProblem();
  std::unique_ptr<Client> alice = As("tok-alice");
  std::unique_ptr<Client> bob = As("tok-bob");
  ASSERT_TRUE(alice->UploadHead(UploadOf(p, "h")).ok());
  ComputeArgs deferred = ComputeOf(p, "h", "s");
  deferred.header.set_request_id("r1");
  deferred.header.set_commit(v1::COMMIT_DEFERRED);
  ASSERT_TRUE(alice->Compute(deferred).ok());

  const absl::StatusCode kNotFound = absl::StatusCode::kNotFound;
  EXPECT_EQ(bob->DescribeHead("h").status().code(), kNotFound);
  EXPECT_EQ(bob->Compute(ComputeOf(p, "h", "s")).status().code(), kNotFound);
  EXPECT_EQ(bob->UnloadHead("h").status().code(), kNotFound);
  EXPECT_EQ(bob->FetchGrad({"h", "s"}).status().code(), kNotFound);
  EXPECT_EQ(bob->ZeroGrad("h", "s").code(), kNotFound);
  EXPECT_EQ(bob->DeleteSession("h", "s").code(), kNotFound);
  v1::CommitRequest commit;
  commit.set_head_id("h");
  commit.set_session_id("s");
  commit.set_request_id("r1");
  commit.set_scale(1.0f);
  EXPECT_EQ(bob->Commit(commit).status().code(), kNotFound);
  absl::StatusOr<std::vector<v1::HeadInfo>> bob_heads = bob->ListHeads();
  ASSERT_TRUE(bob_heads.ok());
  EXPECT_TRUE(bob_heads->empty());
  absl::StatusOr<std::vector<v1::SessionInfo>> bob_sessions = bob->ListSessions();
  ASSERT_TRUE(bob_sessions.ok());
  EXPECT_TRUE(bob_sessions->empty());

  // Bob's own "h" is another head; Alice's stays as it was.
  Problem other = SmallProblem();
  absl::StatusOr<v1::HeadInfo> bobs = bob->UploadHead(UploadOf(other, "h"));
  ASSERT_TRUE(bobs.ok()) << bobs.status();
  absl::StatusOr<v1::HeadInfo> alices = alice->DescribeHead("h");
  ASSERT_TRUE(alices.ok());
  EXPECT_EQ(alices->version(), 1u);
  EXPECT_EQ(alices->sessions(), 1);
  EXPECT_EQ(bobs->sessions(), 0);
  absl::StatusOr<v1::CommitResponse> committed = alice->Commit(commit);
  ASSERT_TRUE(committed.ok()) << committed.status();
  EXPECT_EQ(committed->state(), v1::CONTRIBUTION_COMMITTED);
  absl::StatusOr<std::vector<v1::SessionInfo>> alice_sessions = alice->ListSessions();
  ASSERT_TRUE(alice_sessions.ok());
  ASSERT_EQ(alice_sessions->size(), 1u);
  EXPECT_EQ((*alice_sessions)[0].session_id(), "s");
  EXPECT_EQ((*alice_sessions)[0].contributions(), 1);
  ASSERT_TRUE(bob->UnloadHead("h").ok());
  EXPECT_TRUE(alice->DescribeHead("h").ok());
}

TEST_F(SecurityTest, SharedHeadsServeEveryTenantWithSeparateGradients) {
  StartServer(AuthConfig());
  Problem p = SmallProblem();
  std::unique_ptr<Client> admin = As("tok-admin");
  std::unique_ptr<Client> alice = As("tok-alice");
  std::unique_ptr<Client> bob = As("tok-bob");
  ASSERT_TRUE(admin->UploadHead(UploadOf(p, "shared")).ok());
  ASSERT_TRUE(alice->Compute(ComputeOf(p, "shared", "s")).ok());
  ASSERT_TRUE(alice->Compute(ComputeOf(p, "shared", "s")).ok());
  ASSERT_TRUE(bob->Compute(ComputeOf(p, "shared", "s")).ok());
  absl::StatusOr<flce::FetchedGrad> a = alice->FetchGrad({"shared", "s"});
  absl::StatusOr<flce::FetchedGrad> b = bob->FetchGrad({"shared", "s"});
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->header.contributions(), 2);
  EXPECT_EQ(b->header.contributions(), 1);
  std::vector<float> ga = Floats(a->weight), gb = Floats(b->weight);
  ASSERT_EQ(ga.size(), gb.size());
  double max_diff = 0.0, max_b = 0.0;
  for (size_t i = 0; i < ga.size(); ++i) {
    max_diff = std::max(max_diff, std::fabs(double(ga[i]) - 2.0 * gb[i]));
    max_b = std::max(max_b, std::fabs(double(gb[i])));
  }
  EXPECT_GT(max_b, 0.0);
  EXPECT_LE(max_diff, 1e-5 * max_b) << "alice's grad_W should be twice bob's";

  // Only an admin replaces or unloads a shared head.
  EXPECT_EQ(bob->UnloadHead("shared").status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(bob->UploadHead(UploadOf(p, "shared")).status().code(),
            absl::StatusCode::kPermissionDenied);
  v1::LoadHeadFromFileRequest load;
  load.set_head_id("shared");
  load.set_path("x.safetensors");
  load.set_weight_tensor("w");
  EXPECT_EQ(bob->LoadHeadFromFile(load).status().code(), absl::StatusCode::kPermissionDenied);
  absl::StatusOr<v1::UnloadHeadResponse> unloaded = admin->UnloadHead("shared");
  ASSERT_TRUE(unloaded.ok()) << unloaded.status();
  EXPECT_EQ(unloaded->sessions_dropped(), 2);
  EXPECT_EQ(alice->FetchGrad({"shared", "s"}).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(SecurityTest, ThePreloadedHeadIsShared) {
  ServerConfig config = AuthConfig();
  config.embedded_demo_head = true;
  StartServer(config);
  std::unique_ptr<Client> alice = As("tok-alice");
  absl::StatusOr<std::vector<v1::HeadInfo>> heads = alice->ListHeads();
  ASSERT_TRUE(heads.ok());
  ASSERT_EQ(heads->size(), 1u);
  EXPECT_EQ((*heads)[0].head_id(), "demo");
  EXPECT_EQ(alice->UnloadHead("demo").status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(As("tok-admin")->UnloadHead("demo").ok());
}

// --- limits -----------------------------------------------------------------

TEST_F(SecurityTest, HeadCountAndHeadBytesLimits) {
  Problem p = SmallProblem();
  const int64_t head_bytes = p.spec.vocab_size * p.spec.hidden_size * 4;
  ServerConfig config = TestConfig();
  config.max_heads = 2;
  config.max_head_bytes = 2 * head_bytes + head_bytes / 2;
  StartServer(config);
  std::unique_ptr<Client> client = As("");
  ASSERT_TRUE(client->UploadHead(UploadOf(p, "h1")).ok());
  ASSERT_TRUE(client->UploadHead(UploadOf(p, "h2")).ok());
  ASSERT_TRUE(client->UploadHead(UploadOf(p, "h1")).ok()) << "replacing adds no head";
  absl::StatusOr<v1::HeadInfo> third = client->UploadHead(UploadOf(p, "h3"));
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(third.status().message()), HasSubstr("--max-heads=2"));
  ASSERT_TRUE(client->UnloadHead("h2").ok());

  ProblemSpec big_spec = p.spec;
  big_spec.vocab_size = p.spec.vocab_size * 2;
  Problem big = MakeProblem(big_spec);
  absl::StatusOr<v1::HeadInfo> too_big = client->UploadHead(UploadOf(big, "big"));
  EXPECT_EQ(too_big.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(too_big.status().message()),
              HasSubstr(absl::StrCat("--max-head-bytes=", config.max_head_bytes)));
  EXPECT_TRUE(client->UploadHead(UploadOf(p, "h2")).ok());
}

TEST_F(SecurityTest, ConcurrentCallLimit) {
  ServerConfig config = TestConfig();
  config.max_concurrent_streams = 1;
  StartServer(config);
  Problem p = SmallProblem();
  ASSERT_TRUE(UploadHead(stub(), "h", p).ok());
  std::unique_ptr<Client> client = As("");
  absl::Status while_open;
  ComputeOptions options;
  options.pause_after_chunks = 1;
  options.on_pause = [&] {
    // The compute stream is open on the server: a second call is one too many.
    for (int attempt = 0; attempt < 50; ++attempt) {
      while_open = client->GetServerInfo().status();
      if (!while_open.ok()) break;
      usleep(20000);
    }
  };
  ComputeOutcome out = Compute(stub(), MakeHeader(p, "h", "s", "r1"), p, options);
  EXPECT_TRUE(out.status.ok()) << out.status.error_message();
  EXPECT_EQ(while_open.code(), absl::StatusCode::kResourceExhausted) << while_open;
  EXPECT_THAT(std::string(while_open.message()), HasSubstr("--max-concurrent-streams=1"));
  EXPECT_TRUE(client->GetServerInfo().ok()) << "the limit frees up when the call ends";
}

// --- TLS --------------------------------------------------------------------

class TlsTest : public SecurityTest {
 protected:
  void SetUp() override {
    SecurityTest::SetUp();
    const TestCerts& certs = TestCerts::Get();
    ASSERT_TRUE(certs.ok) << certs.error;
  }
  ServerConfig TlsConfig(bool mutual) {
    const TestCerts& certs = TestCerts::Get();
    ServerConfig config = TestConfig();
    config.tls_cert = certs.server_cert;
    config.tls_key = certs.server_key;
    if (mutual) config.tls_client_ca = certs.ca_cert;
    return config;
  }
  static ClientOptions Tls(const std::string& ca, bool with_cert = false) {
    const TestCerts& certs = TestCerts::Get();
    ClientOptions options;
    options.tls = true;
    options.tls_ca_file = ca;
    if (with_cert) {
      options.tls_cert_file = certs.client_cert;
      options.tls_key_file = certs.client_key;
    }
    options.timeout = absl::Seconds(5);
    return options;
  }
};

TEST_F(TlsTest, HandshakeSucceedsWithTheServersCaAndFailsWithout) {
  StartServer(TlsConfig(/*mutual=*/false));
  const TestCerts& certs = TestCerts::Get();
  Problem p = SmallProblem();
  std::unique_ptr<Client> good = As("", Tls(certs.ca_cert));
  ASSERT_TRUE(good->GetServerInfo().ok());
  ASSERT_TRUE(good->UploadHead(UploadOf(p, "h")).ok());
  ASSERT_TRUE(good->Compute(ComputeOf(p, "h", "s")).ok());
  ClientOptions by_name = Tls(certs.ca_cert);
  by_name.tls_server_name = "localhost";
  EXPECT_TRUE(As("", by_name)->GetServerInfo().ok());

  ClientOptions plaintext;
  plaintext.timeout = absl::Seconds(5);
  EXPECT_EQ(As("", plaintext)->GetServerInfo().status().code(), absl::StatusCode::kUnavailable);
  EXPECT_FALSE(As("", Tls(certs.other_ca_cert))->GetServerInfo().ok()) << "untrusted CA";
  ClientOptions wrong_name = Tls(certs.ca_cert);
  wrong_name.tls_server_name = "not-the-server.example";
  EXPECT_FALSE(As("", wrong_name)->GetServerInfo().ok()) << "name not in the certificate";
}

TEST_F(TlsTest, MutualTlsRefusesAClientWithoutACertificate) {
  ServerConfig config = TlsConfig(/*mutual=*/true);
  config.auth_token_file = WriteFile("tokens", kTokens);
  StartServer(config);
  const TestCerts& certs = TestCerts::Get();
  EXPECT_FALSE(As("tok-alice", Tls(certs.ca_cert))->GetServerInfo().ok());
  std::unique_ptr<Client> with_cert = As("tok-alice", Tls(certs.ca_cert, /*with_cert=*/true));
  EXPECT_TRUE(with_cert->GetServerInfo().ok());
  absl::StatusOr<HealthStatus> health = with_cert->Health();
  ASSERT_TRUE(health.ok()) << health.status();
  // TLS and tokens are independent: a certificate is not a token.
  EXPECT_EQ(As("", Tls(certs.ca_cert, true))->GetServerInfo().status().code(),
            absl::StatusCode::kUnauthenticated);
}

TEST(TlsConfigTest, HalfGivenOrUnreadableTlsFilesStopTheStart) {
  ServerConfig config = TestConfig();
  config.tls_cert = "/nonexistent/server.crt";
  EXPECT_EQ(FlceServer::Create(config).status().code(), absl::StatusCode::kInvalidArgument);
  config.tls_key = "/nonexistent/server.key";
  EXPECT_EQ(FlceServer::Create(config).status().code(), absl::StatusCode::kFailedPrecondition);
  config = TestConfig();
  config.tls_client_ca = "/nonexistent/ca.crt";
  EXPECT_EQ(FlceServer::Create(config).status().code(), absl::StatusCode::kInvalidArgument);
  config = TestConfig();
  config.auth_token_file = "/nonexistent/tokens";
  EXPECT_EQ(FlceServer::Create(config).status().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace flce::server::test
