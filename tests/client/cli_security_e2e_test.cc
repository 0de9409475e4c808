// flce-client's --tls-* and --auth-token* flags against the flce-server
// binary with mutual TLS and token auth: what passes and what is refused, a
// SIGHUP that swaps the tokens, the per-request log lines (with no token in
// them), and the clear-text warning of a server that takes tokens without TLS.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "client/cpp/npy.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/client/subprocess.h"
#include "tests/server/test_certs.h"

namespace flce::test {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

#if defined(FLCE_SERVER_BIN) && defined(FLCE_CLIENT_BIN)
constexpr bool kHaveBinaries = true;
constexpr char kServerBin[] = FLCE_SERVER_BIN;
constexpr char kClientBin[] = FLCE_CLIENT_BIN;
#else
constexpr bool kHaveBinaries = false;
constexpr char kServerBin[] = "";
constexpr char kClientBin[] = "";
#endif

constexpr char kAlice[] = "tok-alice-7f3a9c";
constexpr char kBob[] = "tok-bob-41d2e8";
constexpr char kAdmin[] = "tok-admin-c0ffee";

class CliSecurityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!kHaveBinaries) GTEST_SKIP() << "flce-server is not built in this tree";
    const TestCerts& certs = TestCerts::Get();
    ASSERT_TRUE(certs.ok) << certs.error;
    dir_ = (std::filesystem::temp_directory_path() / ("flce_cli_sec_" + std::to_string(getpid())))
               .string();
    std::filesystem::create_directories(dir_ + "/scratch");
  }
  void TearDown() override {
    server_.reset();
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }

  void Write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ + "/" + name, std::ios::trunc) << text;
  }

  void StartServer(const std::vector<std::string>& extra, const std::string& host) {
    port_ = FreePort();
    ASSERT_GT(port_, 0);
    std::vector<std::string> argv = {
        kServerBin, "--host", host,        "--port", std::to_string(port_), "--metrics-port", "0",
        "--device", "cpu",    "--threads", "2"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    server_ = std::make_unique<BackgroundProcess>(argv, dir_ + "/server.log");
    ASSERT_TRUE(server_->started());
  }

  // The client flags for a TLS connection with the test CA (and client
  // certificate when `cert`).
  static std::vector<std::string> Tls(bool cert) {
    const TestCerts& certs = TestCerts::Get();
    std::vector<std::string> flags = {"--tls-ca", certs.ca_cert};
    if (cert) {
      flags.insert(flags.end(), {"--tls-cert", certs.client_cert, "--tls-key", certs.client_key});
    }
    return flags;
  }

  ProcessResult Cli(std::vector<std::string> flags, const std::vector<std::string>& command) {
    std::vector<std::string> argv = {kClientBin, "--target", "127.0.0.1:" + std::to_string(port_),
                                     "--timeout-s", "10"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    argv.insert(argv.end(), command.begin(), command.end());
    return RunProcess(argv, dir_ + "/scratch");
  }

  static std::string Code(const ProcessResult& run) {
    nlohmann::json json = nlohmann::json::parse(run.out, nullptr, false);
    if (!json.is_object() || !json.contains("error")) return "OK";
    return json["error"].value("code", "?");
  }

  bool WaitHealthy(const std::vector<std::string>& flags) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (std::chrono::steady_clock::now() < deadline) {
      if (!server_->Running()) return false;
      if (Cli(flags, {"health"}).exit_code == 0) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return false;
  }

  std::string dir_;
  int port_ = 0;
  std::unique_ptr<BackgroundProcess> server_;
};

TEST_F(CliSecurityTest, MutualTlsAndTokensEndToEndWithReloadOnSighup) {
  const TestCerts& certs = TestCerts::Get();
  Write("tokens", std::string(kAlice) + " alice\n" + kAdmin + " ops admin\n");
  Write("alice.token", std::string(kAlice) + "\n");
  StartServer({"--tls-cert", certs.server_cert, "--tls-key", certs.server_key, "--tls-client-ca",
               certs.ca_cert, "--auth-token-file", dir_ + "/tokens"},
              "127.0.0.1");
  // Health needs TLS (and the client certificate) but no token.
  ASSERT_TRUE(WaitHealthy(Tls(true))) << ReadFile(dir_ + "/server.log");

  EXPECT_EQ(Code(Cli(Tls(true), {"server-info"})), "UNAUTHENTICATED");
  EXPECT_EQ(Code(Cli(Tls(true), {"--auth-token", "tok-wrong", "server-info"})), "UNAUTHENTICATED");
  ProcessResult plaintext = Cli({"--auth-token", kAlice}, {"server-info"});
  EXPECT_EQ(plaintext.exit_code, 1);
  EXPECT_EQ(Code(plaintext), "UNAVAILABLE");
  EXPECT_NE(Cli(Tls(false), {"--auth-token", kAlice, "server-info"}).exit_code, 0)
      << "no client certificate";

  // A compute as alice on the shared demo head, token from a file, the
  // certificate checked for the name "localhost".
  constexpr int64_t kTokens = 16, kHidden = 512;
  std::string hidden(kTokens * kHidden * 4, '\0');
  for (int64_t i = 0; i < kTokens * kHidden; ++i) {
    float v = static_cast<float>((i * 37) % 101) / 101.0f - 0.5f;
    std::memcpy(&hidden[i * 4], &v, 4);
  }
  std::string targets(kTokens * 4, '\0');
  for (int32_t t = 0; t < kTokens; ++t) {
    int32_t y = t * 1999;
    std::memcpy(&targets[t * 4], &y, 4);
  }
  ASSERT_TRUE(WriteNpy(dir_ + "/h.npy", NpyArray{NpyType::kF32, {kTokens, kHidden}, hidden}).ok());
  ASSERT_TRUE(WriteNpy(dir_ + "/t.npy", NpyArray{NpyType::kI32, {kTokens}, targets}).ok());
  std::vector<std::string> alice = Tls(true);
  alice.insert(alice.end(),
               {"--tls-server-name", "localhost", "--auth-token-file", dir_ + "/alice.token"});
  ProcessResult compute = Cli(alice, {"compute", "--head", "demo", "--session", "s1", "--hidden",
                                      dir_ + "/h.npy", "--targets", dir_ + "/t.npy"});
  ASSERT_EQ(compute.exit_code, 0) << compute.out << compute.err;
  nlohmann::json summary = nlohmann::json::parse(compute.out, nullptr, false);
  EXPECT_TRUE(summary.is_object() && summary.contains("loss")) << compute.out;
  ProcessResult sessions = Cli(alice, {"sessions"});
  EXPECT_THAT(sessions.out, HasSubstr("s1"));
  std::vector<std::string> admin = Tls(true);
  admin.insert(admin.end(), {"--auth-token", kAdmin});
  EXPECT_THAT(Cli(admin, {"sessions"}).out, Not(HasSubstr("s1"))) << "alice's session";
  EXPECT_EQ(Code(Cli(alice, {"unload", "--head", "demo"})), "PERMISSION_DENIED");

  // SIGHUP: alice's token goes, bob's comes.
  Write("tokens", std::string(kBob) + " bob\n" + kAdmin + " ops admin\n");
  ASSERT_EQ(kill(server_->pid(), SIGHUP), 0);
  std::vector<std::string> bob = Tls(true);
  bob.insert(bob.end(), {"--auth-token", kBob});
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (Code(Cli(bob, {"server-info"})) != "OK" && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(Code(Cli(bob, {"server-info"})), "OK");
  EXPECT_EQ(Code(Cli(alice, {"server-info"})), "UNAUTHENTICATED");
  EXPECT_TRUE(server_->Running()) << "SIGHUP must not stop the server";

  EXPECT_EQ(server_->Stop(30), 0);
  std::string log = ReadFile(dir_ + "/server.log");
  EXPECT_THAT(log, HasSubstr("TLS on, mutual"));
  EXPECT_THAT(log, HasSubstr("auth tokens reloaded from"));
  EXPECT_THAT(log, HasSubstr("2 token(s)"));
  EXPECT_THAT(log, HasSubstr("rpc=Compute tenant=alice head=demo session=s1 tokens=16"));
  EXPECT_THAT(log, HasSubstr("code=UNAUTHENTICATED"));
  for (const char* token : {kAlice, kBob, kAdmin}) EXPECT_THAT(log, Not(HasSubstr(token)));
  EXPECT_THAT(log, Not(HasSubstr("clear text")));
}

TEST_F(CliSecurityTest, TokensWithoutTlsOffLoopbackAreWarnedAbout) {
  Write("tokens", std::string(kAlice) + " alice\n");
  StartServer({"--demo-head=false", "--auth-token-file", dir_ + "/tokens"}, "0.0.0.0");
  ASSERT_TRUE(WaitHealthy({})) << ReadFile(dir_ + "/server.log");
  EXPECT_EQ(Code(Cli({"--auth-token", kAlice}, {"list-heads"})), "OK");
  EXPECT_EQ(server_->Stop(30), 0);
  std::string log = ReadFile(dir_ + "/server.log");
  EXPECT_THAT(log, HasSubstr(" W flce-server: bearer tokens travel in clear text"));
  EXPECT_THAT(log, Not(HasSubstr(kAlice)));
}

}  // namespace
}  // namespace flce::test
