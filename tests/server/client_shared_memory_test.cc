// The C++ client's shared-memory transport (ClientOptions::Transport) against
// an in-process server: taken by itself where the server offers it, results
// bit for bit those of messages, regions reused across calls and unmapped on
// both sides once the client goes, and messages (or a clear refusal) where
// the server does not offer it.
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/cpp/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/base/local_transports_flag.h"
#include "tests/server/server_test_util.h"

namespace flce::server::test {
namespace {

using ::flce::test::MakeProblem;
using ::testing::HasSubstr;

// Mappings of flce shared-memory objects in this process (the client's and
// the in-process server's), by name.
std::vector<std::string> MappedRegionNames() {
  std::ifstream maps("/proc/self/maps");
  std::vector<std::string> names;
  for (std::string line; std::getline(maps, line);) {
    const size_t at = line.find("/dev/shm/flce-");
    if (at != std::string::npos) names.push_back(line.substr(at));
  }
  std::sort(names.begin(), names.end());
  return names;
}

int MappedRegions() { return static_cast<int>(MappedRegionNames().size()); }

class ClientSharedMemoryTest : public ServerTest {
 protected:
  void Start(bool shm, absl::Duration lease = absl::Seconds(60)) {
    ServerConfig config = TestConfig();
    config.shm_transport = shm;
    config.region_lease = lease;
    Start(config);
  }
  void Start(const ServerConfig& config) {
    StartServer(config);
    problem_ = MakeProblem(TinyF32Spec());
    ASSERT_TRUE(UploadHead(stub(), "h", problem_).ok());
  }

  std::unique_ptr<Client> Connect(ClientOptions::Transport transport, bool unix_socket = true) {
    ClientOptions options;
    options.target = absl::StrCat("127.0.0.1:", server().port());
    options.timeout = absl::Seconds(20);
    options.transport = transport;
    options.unix_socket = unix_socket;
    auto client = Client::Connect(options);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? *std::move(client) : nullptr;
  }

  absl::StatusOr<::flce::ComputeOutcome> Compute(Client& client, const std::string& session,
                                         bool forward_only = false) {
    ComputeArgs args;
    args.header = MakeHeader(problem_, "h", session, "");
    args.header.set_deterministic(true);
    args.header.mutable_outputs()->set_per_token_loss(true);
    args.header.mutable_outputs()->set_forward_only(forward_only);
    args.header.clear_targets();
    args.targets = problem_.targets;
    args.hidden = problem_.hidden_bytes;
    return client.Compute(args);
  }

  std::string Grad(Client& client, const std::string& session) {
    auto grad = client.FetchGrad({"h", session});
    EXPECT_TRUE(grad.ok()) << grad.status();
    return grad.ok() ? grad->weight : "";
  }

  Problem problem_;
};

TEST_F(ClientSharedMemoryTest, IsTakenWhereOfferedAndMatchesMessagesBitForBit) {
  Start(true);
  ASSERT_EQ(MappedRegions(), 0);
  {
    std::unique_ptr<Client> shm = Connect(ClientOptions::Transport::kAuto);
    std::unique_ptr<Client> messages = Connect(ClientOptions::Transport::kGrpc);
    auto a = Compute(*shm, "shm");
    auto b = Compute(*messages, "messages");
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_EQ(a->transport, "shm");
    EXPECT_EQ(b->transport, "grpc");
    // The targets beside hidden: the header the server checked had none.
    EXPECT_TRUE(a->targets_in_region);
    EXPECT_FALSE(b->targets_in_region);
    EXPECT_EQ(a->summary.loss(), b->summary.loss());
    EXPECT_EQ(a->grad_input, b->grad_input);
    EXPECT_EQ(a->grad_input.size(), problem_.hidden_bytes.size());
    EXPECT_EQ(a->per_token_loss, b->per_token_loss);
    EXPECT_EQ(Grad(*shm, "shm"), Grad(*messages, "messages"));
    const int mapped = MappedRegions();
    EXPECT_GE(mapped, 2) << "the client's mapping and the server's";
    // The next call reuses the region, a forward-only one too.
    auto again = Compute(*shm, "shm");
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(again->grad_input, a->grad_input);
    auto forward = Compute(*shm, "shm", /*forward_only=*/true);
    ASSERT_TRUE(forward.ok()) << forward.status();
    EXPECT_EQ(forward->transport, "shm");
    EXPECT_TRUE(forward->grad_input.empty());
    EXPECT_EQ(forward->summary.loss(), a->summary.loss());
    EXPECT_EQ(MappedRegions(), mapped);
  }
  // The client unmapped its regions; its Regions stream ended, so the server
  // released them too.
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (MappedRegions() != 0 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_EQ(MappedRegions(), 0);
}

TEST_F(ClientSharedMemoryTest, WithoutItAutoSendsMessagesAndShmIsRefusedWithTheReason) {
  Start(false);
  std::unique_ptr<Client> automatic = Connect(ClientOptions::Transport::kAuto);
  auto a = Compute(*automatic, "s");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->transport, "grpc");
  std::unique_ptr<Client> insisting = Connect(ClientOptions::Transport::kShm);
  auto b = Compute(*insisting, "s");
  EXPECT_EQ(b.status().code(), absl::StatusCode::kFailedPrecondition) << b.status();
  EXPECT_THAT(b.status().message(), HasSubstr("--local-transports=shm"));
  EXPECT_EQ(MappedRegions(), 0);
}

// The client renews its Regions stream's lease while it is idle: after
// several leases without a call, the next call uses the same region.
TEST_F(ClientSharedMemoryTest, AnIdleClientKeepsItsRegionsThroughRenewals) {
  Start(true, absl::Seconds(1));
  std::unique_ptr<Client> client = Connect(ClientOptions::Transport::kAuto);
  auto first = Compute(*client, "s");
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_EQ(first->transport, "shm");
  const std::vector<std::string> mapped = MappedRegionNames();
  ASSERT_EQ(mapped.size(), 2u) << "the client's mapping and the server's of one region";
  absl::SleepFor(absl::Seconds(3));
  EXPECT_EQ(MappedRegionNames(), mapped) << "the server released the region of an idle client";
  auto again = Compute(*client, "s");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->transport, "shm");
  EXPECT_EQ(MappedRegionNames(), mapped);
}

TEST_F(ClientSharedMemoryTest, ConcurrentCallsUseRegionsOfTheirOwn) {
  Start(true);
  std::unique_ptr<Client> client = Connect(ClientOptions::Transport::kAuto);
  auto reference = Compute(*client, "reference");
  ASSERT_TRUE(reference.ok()) << reference.status();
  std::vector<absl::StatusOr<::flce::ComputeOutcome>> outcomes(4, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back(
        [&, i] { outcomes[i] = Compute(*client, absl::StrCat("concurrent-", i)); });
  }
  for (std::thread& t : threads) t.join();
  for (const auto& outcome : outcomes) {
    ASSERT_TRUE(outcome.ok()) << outcome.status();
    EXPECT_EQ(outcome->transport, "shm");
    EXPECT_EQ(outcome->grad_input, reference->grad_input);
  }
}

// flce-server's default (--local-transports=auto): the client moves to the
// socket the server names and takes the shared memory offered there to the
// server's own user; kept on TCP, it is offered none and sends messages.
TEST_F(ClientSharedMemoryTest, ADefaultServerOffersItThroughItsSocketOnly) {
  ServerConfig config = TestConfig();
  ASSERT_TRUE(ApplyLocalTransportsFlag("auto", config).ok());
  config.unix_socket = absl::StrCat(::testing::TempDir(), "/flce-default-", getpid(), ".sock");
  Start(config);
  std::unique_ptr<Client> near = Connect(ClientOptions::Transport::kAuto);
  std::unique_ptr<Client> far = Connect(ClientOptions::Transport::kAuto, /*unix_socket=*/false);
  auto a = Compute(*near, "near");
  auto b = Compute(*far, "far");
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(a->transport, "shm");
  EXPECT_EQ(near->messages_target(), "unix:" + config.unix_socket);
  EXPECT_EQ(b->transport, "grpc");
  EXPECT_EQ(a->summary.loss(), b->summary.loss());
  EXPECT_EQ(a->grad_input, b->grad_input);
  std::unique_ptr<Client> insisting = Connect(ClientOptions::Transport::kShm, false);
  auto refused = Compute(*insisting, "insisting");
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(refused.status().message()), ::testing::HasSubstr("through 127.0.0.1"));
}

// Each call in messages tells the server why (ComputeHeader.messages_reason),
// which counts it in flce_compute_calls_total.
TEST_F(ClientSharedMemoryTest, EachCallInMessagesTellsTheServerWhy) {
  ServerConfig config = TestConfig();
  ASSERT_TRUE(ApplyLocalTransportsFlag("auto", config).ok());
  config.unix_socket = absl::StrCat(::testing::TempDir(), "/flce-reasons-", getpid(), ".sock");
  Start(config);
  auto calls = [&](const std::string& transport, const std::string& reason) {
    return Sample(server().metrics_text(),
                  absl::StrCat("flce_compute_calls_total{reason=\"", reason, "\",transport=\"",
                               transport, "\"}"));
  };
  std::unique_ptr<Client> near = Connect(ClientOptions::Transport::kAuto);
  std::unique_ptr<Client> far = Connect(ClientOptions::Transport::kAuto, /*unix_socket=*/false);
  std::unique_ptr<Client> asked = Connect(ClientOptions::Transport::kGrpc);
  for (Client* client : {near.get(), far.get(), asked.get()}) {
    auto out = Compute(*client, "s");
    ASSERT_TRUE(out.ok()) << out.status();
  }
  EXPECT_EQ(calls("shm", "region"), 1);
  EXPECT_EQ(calls("messages_tcp", "not_offered"), 1);  // TCP loopback is offered no region
  EXPECT_EQ(calls("messages_unix_socket", "asked"), 1);
  EXPECT_EQ(calls("messages_tcp", "unspecified") + calls("messages_unix_socket", "unspecified"), 0);
}

// A retry goes the way its request id first went: a GPU server fingerprints
// hidden from a region apart from hidden in messages, so a retry that could
// not take the region is refused by the client, saying why.
TEST_F(ClientSharedMemoryTest, ARetryGoesTheWayItsRequestIdFirstWent) {
  ServerConfig config = TestConfig();
  config.shm_transport = true;
  config.max_region_bytes_per_tenant = 2 << 20;  // the first 1 MiB region and no more
  Start(config);
  std::unique_ptr<Client> client = Connect(ClientOptions::Transport::kAuto);
  auto call = [&](const Problem& problem, const std::string& head, const std::string& id) {
    ComputeArgs args;
    args.header = MakeHeader(problem, head, "s", id);
    args.header.clear_targets();
    args.targets = problem.targets;
    args.hidden = problem.hidden_bytes;
    return client->Compute(args);
  };
  auto first = call(problem_, "no-such-head", "first-through-shm");
  ASSERT_EQ(first.status().code(), absl::StatusCode::kNotFound) << first.status();

  // The retry's region (~3 MiB) passes the tenant's cap: this client then
  // sends messages, but not for this request id.
  ProblemSpec big_spec = TinyF32Spec();
  big_spec.num_tokens = 20000;
  Problem big = MakeProblem(big_spec);
  auto retry = call(big, "h", "first-through-shm");
  ASSERT_EQ(retry.status().code(), absl::StatusCode::kFailedPrecondition) << retry.status();
  EXPECT_THAT(std::string(retry.status().message()),
              HasSubstr("request_id first-through-shm was first sent through shm"));
  auto fresh = call(big, "h", "a-new-id");
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_EQ(fresh->transport, "grpc");
}

}  // namespace
}  // namespace flce::server::test
