// The shipped flce-server binary: SIGTERM drains a call in flight and exits
// 0; /metrics is served by prometheus-cpp's exposer in the same process as
// the CUDA plugin (when this tree builds one), and health answers SERVING.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/cpp/health_check.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/engine_factory.h"
#include "tests/server/server_test_util.h"

extern char** environ;

namespace flce::server::test {
namespace {

using ::flce::test::MakeProblem;
using ::testing::HasSubstr;

// The binary and plugin this tree built, unless the environment names others
// (a copy of the build run on another machine).
std::string ServerBinary() {
  const char* env = std::getenv("FLCE_SERVER_BINARY");
  return env != nullptr && *env != '\0' ? env : FLCE_SERVER_BINARY;
}

#ifdef FLCE_TEST_CUDA_PLUGIN
std::string CudaPlugin() {
  const char* env = std::getenv("FLCE_TEST_CUDA_PLUGIN");
  return env != nullptr && *env != '\0' ? env : FLCE_TEST_CUDA_PLUGIN;
}
#endif

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// A flce-server child process with its stderr in a file.
class ServerProcess {
 public:
  ServerProcess(std::vector<std::string> args, std::vector<std::string> extra_env) {
    log_ = absl::StrCat(::testing::TempDir(), "/flce-server-", getpid(), "-", ++counter_, ".log");
    args.insert(args.begin(), ServerBinary());
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::vector<std::string> env_strings = std::move(extra_env);
    for (char** e = environ; *e != nullptr; ++e) env_strings.push_back(*e);
    std::vector<char*> envp;
    for (std::string& e : env_strings) envp.push_back(e.data());
    envp.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, log_.c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0644);
    spawned_ = posix_spawn(&pid_, argv[0], &actions, nullptr, argv.data(), envp.data()) == 0;
    posix_spawn_file_actions_destroy(&actions);
  }

  ~ServerProcess() {
    if (pid_ > 0 && !exited_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }

  bool spawned() const { return spawned_; }
  pid_t pid() const { return pid_; }
  std::string log() const { return ReadFile(log_); }

  // The gRPC port from the "serving ... on port N" log line; 0 on timeout.
  int WaitForPort() {
    std::regex serving("serving flce.v1.Flce on port ([0-9]+)");
    for (int i = 0; i < 600; ++i) {
      std::smatch m;
      std::string text = log();
      if (std::regex_search(text, m, serving)) return std::stoi(m[1]);
      int status;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        exited_ = true;
        return 0;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return 0;
  }

  // The exit code, or -signal; -1000 if it did not exit in time.
  int WaitExit(std::chrono::seconds timeout) {
    auto end = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < end) {
      int status;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        exited_ = true;
        return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return -1000;
  }

 private:
  static inline int counter_ = 0;
  std::string log_;
  pid_t pid_ = -1;
  bool spawned_ = false;
  bool exited_ = false;
};

std::unique_ptr<v1::Flce::Stub> StubFor(int port) {
  return v1::Flce::NewStub(
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
}

// GET path over a plain socket; the whole response, or "" on failure.
std::string HttpGet(int port, const std::string& path) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return "";
  }
  std::string request =
      absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
  if (write(fd, request.data(), request.size()) != static_cast<ssize_t>(request.size())) {
    close(fd);
    return "";
  }
  std::string response;
  char buf[4096];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) response.append(buf, n);
  close(fd);
  return response;
}

// grpc.health.v1.Health/Check for the whole server, with the client's own
// check; -1 when the call fails.
int ServerHealth(int port) {
  auto channel =
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials());
  absl::StatusOr<flce::HealthStatus> status = CheckHealth(channel, "", absl::Seconds(10));
  return status.ok() ? static_cast<int>(*status) : -1;
}

Problem DemoSizedProblem() {
  ProblemSpec ps;
  ps.vocab_size = 101;  // targets only; the demo head has V = 32000
  ps.hidden_size = 512;
  ps.num_tokens = 96;
  ps.head_dtype = DType::kBF16;
  ps.hidden_dtype = DType::kBF16;
  return MakeProblem(ps);
}

// absl lists only flags of a file named after the binary unless told which
// file holds them; without that, --help printed "No flags matched".
TEST(BinaryTest, HelpListsTheServersFlags) {
  std::string command = absl::StrCat(ServerBinary(), " --help 2>&1");
  FILE* pipe = popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string text;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof(buf), pipe)) > 0;) text.append(buf, n);
  pclose(pipe);
  EXPECT_THAT(text, ::testing::Not(::testing::HasSubstr("No flags matched")));
  for (const char* flag : {"--port", "--host", "--workspace_mb", "--threads", "--demo_head",
                           "--cuda_plugin", "--max_concurrent_streams", "--max_head_bytes",
                           "--max_upload_bytes", "--max_response_mb", "--metrics_host"}) {
    EXPECT_THAT(text, ::testing::HasSubstr(flag)) << text;
  }
}

// The memory limits a server runs with are stated at start, defaulted or not.
TEST(BinaryTest, StartLogStatesTheMemoryBudgets) {
  ServerProcess server({"--port=0", "--metrics-port=0", "--device=cpu", "--threads=1",
                        "--max-upload-bytes=123456789"},
                       {});
  ASSERT_TRUE(server.spawned());
  ASSERT_GT(server.WaitForPort(), 0) << server.log();
  std::string log = server.log();
  EXPECT_THAT(log, HasSubstr("(0.11 GiB, --max-upload-bytes)")) << log;
  EXPECT_THAT(log, HasSubstr("uploads in progress 123456789 bytes")) << log;
  EXPECT_THAT(log, HasSubstr("default of --max-head-bytes")) << log;
  EXPECT_THAT(log, HasSubstr("of host memory")) << log;
}

TEST(BinaryTest, SigtermDrainsTheCallInFlightAndExitsZero) {
  ServerProcess server(
      {"--port=0", "--metrics-port=0", "--device=cpu", "--drain-seconds=20", "--threads=2"}, {});
  ASSERT_TRUE(server.spawned());
  int port = server.WaitForPort();
  ASSERT_GT(port, 0) << server.log();
  auto stub = StubFor(port);
  Problem problem = DemoSizedProblem();
  ComputeOptions options;
  options.rows_per_chunk = 16;
  options.pause_after_chunks = 2;
  options.on_pause = [&] {
    // Signal only once the server holds the call (its session slot is taken):
    // a call still in the client's buffers would be refused, not drained.
    ASSERT_TRUE(WaitForPending(*stub, "s", 1)) << server.log();
    kill(server.pid(), SIGTERM);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  };
  ComputeOutcome out = Compute(*stub, MakeHeader(problem, "demo", "s", "r1"), problem, options);
  EXPECT_TRUE(out.status.ok()) << out.status.error_message() << "\n" << server.log();
  EXPECT_TRUE(out.has_summary);
  EXPECT_EQ(out.grad_rows, problem.spec.num_tokens);
  EXPECT_GT(out.summary.loss(), 0.0);
  EXPECT_EQ(server.WaitExit(std::chrono::seconds(30)), 0) << server.log();
  EXPECT_THAT(server.log(), HasSubstr("SIGTERM"));
}

#ifdef FLCE_TEST_CUDA_PLUGIN
// The built flce-server, started as the README says (no FLCE_CUDA_PLUGIN, no
// --cuda-plugin), finds the plugin where the build puts it: mapped whether or
// not this machine has a GPU (without one the engine falls back to the CPU).
// A head trained on the server survives a crash: saved, the server killed
// (SIGKILL), a new one started and the checkpoint loaded, the next steps give
// the weights of the run that was not interrupted, bit for bit (the CPU engine
// with a fixed --threads is deterministic).
TEST(BinaryTest, ACheckpointSurvivesSigkillAndTheRunContinuesBitForBit) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/flce-ckpt-", getpid());
  const std::vector<std::string> args = {"--port=0",          "--metrics-port=0",
                                         "--device=cpu",      "--threads=2",
                                         "--demo-head=false", "--checkpoint-dir=" + dir};
  auto data = [](int k) {
    ProblemSpec ps = TinyF32Spec();
    ps.head_dtype = DType::kBF16;
    ps.has_bias = true;
    ps.seed = 1000 + k;
    return MakeProblem(ps);
  };
  auto step = [&](v1::Flce::Stub& stub, int k) {
    Problem p = data(k);
    v1::ComputeHeader header = MakeHeader(p, "h", "s", absl::StrCat("c", k));
    header.set_deterministic(true);
    ComputeOutcome out = Compute(stub, header, p);
    ASSERT_TRUE(out.status.ok()) << out.status.error_message();
    v1::StepResponse response;
    ASSERT_TRUE(StepHead(stub, "h", "s", absl::StrCat("step-", k), 1e-2, &response).ok());
    ASSERT_EQ(response.outcome(), v1::STEP_APPLIED);
  };
  std::vector<std::vector<float>> uninterrupted;
  {
    ServerProcess server(args, {});
    ASSERT_TRUE(server.spawned());
    const int port = server.WaitForPort();
    ASSERT_GT(port, 0) << server.log();
    auto stub = StubFor(port);
    ASSERT_TRUE(UploadHead(*stub, "h", data(0)).ok());
    v1::CreateOptimizerRequest create;
    create.set_head_id("h");
    create.set_kind(v1::OPTIMIZER_ADAMW);
    ASSERT_TRUE(CreateOptimizer(*stub, create).ok());
    for (int k = 0; k < 2; ++k) step(*stub, k);
    v1::SaveCheckpointRequest save;
    save.set_head_id("h");
    save.set_name("at-2");
    v1::CheckpointInfo info;
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub->SaveCheckpoint(&ctx, save, &info).ok());
    for (int k = 2; k < 7; ++k) {
      step(*stub, k);
      DownloadedHead master = DownloadHead(*stub, "h", true);
      ASSERT_TRUE(master.status.ok());
      master.weight.insert(master.weight.end(), master.bias.begin(), master.bias.end());
      uninterrupted.push_back(master.weight);
    }
    kill(server.pid(), SIGKILL);
    EXPECT_EQ(server.WaitExit(std::chrono::seconds(10)), -SIGKILL);
  }
  ServerProcess server(args, {});
  ASSERT_TRUE(server.spawned());
  const int port = server.WaitForPort();
  ASSERT_GT(port, 0) << server.log();
  auto stub = StubFor(port);
  v1::LoadCheckpointRequest load;
  load.set_head_id("h");
  load.set_name("at-2");
  v1::HeadInfo head;
  {
    grpc::ClientContext ctx;
    grpc::Status status = stub->LoadCheckpoint(&ctx, load, &head);
    ASSERT_TRUE(status.ok()) << status.error_message() << server.log();
  }
  EXPECT_EQ(head.optimizer().steps(), 2);
  for (int k = 2; k < 7; ++k) {
    step(*stub, k);
    DownloadedHead master = DownloadHead(*stub, "h", true);
    master.weight.insert(master.weight.end(), master.bias.begin(), master.bias.end());
    EXPECT_TRUE(master.weight == uninterrupted[k - 2]) << "step " << k << " differs";
  }
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
}

TEST(BinaryTest, LogFormatJsonWritesOneObjectPerLine) {
  ServerProcess server({"--port=0", "--metrics-port=0", "--device=cpu", "--threads=2",
                        "--log-format=json", "--log-level=info"},
                       {});
  ASSERT_TRUE(server.spawned());
  ASSERT_GT(server.WaitForPort(), 0) << server.log();
  kill(server.pid(), SIGTERM);
  EXPECT_EQ(server.WaitExit(std::chrono::seconds(30)), 0) << server.log();
  std::istringstream lines(server.log());
  int objects = 0;
  for (std::string line; std::getline(lines, line);) {
    EXPECT_TRUE(absl::StartsWith(line, "{\"level\":") && absl::EndsWith(line, "}")) << line;
    ++objects;
  }
  EXPECT_GE(objects, 3);
  ServerProcess bad({"--port=0", "--log-format=xml"}, {});
  ASSERT_TRUE(bad.spawned());
  EXPECT_EQ(bad.WaitExit(std::chrono::seconds(30)), 2);
  EXPECT_THAT(bad.log(), HasSubstr("--log-format=xml is not text or json"));
}

TEST(BinaryTest, BuiltServerFindsThePluginInTheBuildTree) {
  // Empty counts as unset, and comes before whatever the test's own environment says.
  ServerProcess server({"--port=0", "--metrics-port=0", "--device=auto", "--threads=1"},
                       {"FLCE_CUDA_PLUGIN="});
  ASSERT_TRUE(server.spawned());
  ASSERT_GT(server.WaitForPort(), 0) << server.log();
  std::string maps = ReadFile(absl::StrCat("/proc/", server.pid(), "/maps"));
  EXPECT_THAT(maps, HasSubstr(CudaPlugin())) << server.log();
}
#endif

TEST(BinaryTest, NvidiaGpuListedReadsTheDriversDirectory) {
  char dir_template[] = "/tmp/flce-gpus-XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  const std::string dir = dir_template;
  EXPECT_FALSE(NvidiaGpuListed(dir)) << "empty: no GPU";
  EXPECT_FALSE(NvidiaGpuListed(dir + "/absent")) << "no driver";
  const std::string gpu = dir + "/0000:3b:00.0";
  ASSERT_EQ(mkdir(gpu.c_str(), 0700), 0);
  EXPECT_TRUE(NvidiaGpuListed(dir));
  rmdir(gpu.c_str());
  rmdir(dir.c_str());
}

// --metrics-host reaches the exposer: 127.0.0.2 is loopback, but a socket
// bound to it does not accept on 127.0.0.1 (nor one bound to 127.0.0.1 on it).
TEST(BinaryTest, MetricsHostFlagPicksTheExposersAddress) {
  int metrics_port = FreePort();
  ServerProcess server({"--host=127.0.0.1", "--port=0", "--metrics-host=127.0.0.2",
                        absl::StrCat("--metrics-port=", metrics_port), "--device=cpu",
                        "--threads=1", "--demo-head=false"},
                       {});
  ASSERT_TRUE(server.spawned());
  ASSERT_GT(server.WaitForPort(), 0) << server.log();
  auto accepts = [metrics_port](const char* ip) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(metrics_port));
    inet_pton(AF_INET, ip, &addr.sin_addr);
    bool ok = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    close(fd);
    return ok;
  };
  EXPECT_TRUE(accepts("127.0.0.2")) << server.log();
  EXPECT_FALSE(accepts("127.0.0.1")) << server.log();
  EXPECT_THAT(server.log(), HasSubstr("/metrics on 127.0.0.2 port"));
  kill(server.pid(), SIGTERM);
  EXPECT_EQ(server.WaitExit(std::chrono::seconds(30)), 0) << server.log();
}

TEST(BinaryTest, MetricsExposerServesBesideTheCudaPlugin) {
  int metrics_port = FreePort();
  std::vector<std::string> env;
#ifdef FLCE_TEST_CUDA_PLUGIN
  env.push_back(absl::StrCat("FLCE_CUDA_PLUGIN=", CudaPlugin()));
#endif
  ServerProcess server(
      {"--port=0", absl::StrCat("--metrics-port=", metrics_port), "--device=auto", "--threads=2"},
      env);
  ASSERT_TRUE(server.spawned());
  int port = server.WaitForPort();
  ASSERT_GT(port, 0) << server.log();
#ifdef FLCE_TEST_CUDA_PLUGIN
  // The plugin (and cuBLASLt with it) is loaded whether or not a GPU is
  // present: this is the combination that broke civetweb when linked.
  std::string maps = ReadFile(absl::StrCat("/proc/", server.pid(), "/maps"));
  EXPECT_THAT(maps, HasSubstr("libflce_cuda.so"));
  EXPECT_THAT(maps, HasSubstr("libcublasLt"));
#endif
  EXPECT_EQ(ServerHealth(port), static_cast<int>(flce::HealthStatus::kServing))
      << "grpc.health.v1 should answer SERVING";
  auto stub = StubFor(port);
  grpc::ClientContext context;
  v1::ServerInfo info;
  ASSERT_TRUE(stub->GetServerInfo(&context, v1::ServerInfoRequest(), &info).ok());
  // A compute on the demo head with whatever engine --device=auto chose (the
  // CUDA engine on a GPU machine), beside the exposer.
  Problem problem = DemoSizedProblem();
  ComputeOutcome out = Compute(*stub, MakeHeader(problem, "demo", "s", "r1"), problem);
  ASSERT_TRUE(out.status.ok()) << out.status.error_message() << "\n" << server.log();
  EXPECT_EQ(out.grad_rows, problem.spec.num_tokens);
  EXPECT_TRUE(std::isfinite(out.summary.loss()));
  EXPECT_GT(out.summary.loss(), 0.0);
  EXPECT_EQ(out.summary.engine(), info.engine());
  std::cerr << "engine: " << info.engine() << ", loss " << out.summary.loss() << "\n";
  std::string metrics = HttpGet(metrics_port, "/metrics");
  EXPECT_THAT(metrics, HasSubstr("200 OK"));
  EXPECT_THAT(metrics, HasSubstr("flce_requests_total{"));
  EXPECT_THAT(metrics, HasSubstr("rpc=\"GetServerInfo\""));
  EXPECT_THAT(metrics, HasSubstr("flce_request_duration_seconds_bucket"));
  EXPECT_THAT(metrics, HasSubstr("flce_inflight_requests"));
  EXPECT_THAT(metrics, HasSubstr("flce_tokens_total{head=\"demo\""));
  EXPECT_THAT(metrics, HasSubstr("flce_received_bytes_total{rpc=\"Compute\"}"));
  EXPECT_THAT(metrics, HasSubstr("flce_sent_bytes_total{rpc=\"Compute\"}"));
  EXPECT_THAT(metrics, HasSubstr("flce_head_weight_bytes{head=\"demo\"}"));
  EXPECT_THAT(metrics, HasSubstr("flce_heads_loaded 1"));
  kill(server.pid(), SIGTERM);
  EXPECT_EQ(server.WaitExit(std::chrono::seconds(30)), 0) << server.log();
}

}  // namespace
}  // namespace flce::server::test
