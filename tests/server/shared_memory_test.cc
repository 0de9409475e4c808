// The shm local transport (--local-transports=shm): Regions registration,
// Compute with ComputeHeader.shared bit for bit as with messages, and every
// refusal touching nothing: bad names, sizes and offsets, a region that is
// released, expired or truncated under the call, a server that does not
// allow it.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/state/shared_regions.h"
#include "kernels/engine_factory.h"
#include "tests/server/region_helpers.h"
#include "tests/server/server_test_util.h"
#include "tests/support/delegating_engine.h"

namespace flce::server::test {
namespace {

using ::flce::test::DelegatingEngine;
using ::flce::test::MakeProblem;
using ::testing::HasSubstr;

class SharedMemoryTest : public ServerTest {
 protected:
  void SetUp() override { Start(true, absl::Seconds(60)); }

  void Start(bool shm, absl::Duration lease) {
    ServerConfig config = TestConfig();
    config.shm_transport = shm;
    config.region_lease = lease;
    StartServer(config);
    problem_ = MakeProblem(TinyF32Spec());
    ASSERT_TRUE(UploadHead(stub(), "h", problem_).ok());
    hidden_bytes_ = static_cast<int64_t>(problem_.hidden_bytes.size());
  }

  // Header and end only; hidden at offset 0 of the region, grad_input after it.
  ComputeOutcome SharedCompute(const std::string& region_id, const std::string& session,
                               const std::string& request_id, int64_t hidden_offset = 0,
                               int64_t grad_offset = -1) {
    v1::ComputeHeader header = MakeHeader(problem_, "h", session, request_id);
    header.set_deterministic(true);
    header.mutable_shared()->set_region_id(region_id);
    header.mutable_shared()->set_hidden_offset(hidden_offset);
    header.mutable_shared()->set_grad_input_offset(grad_offset < 0 ? hidden_bytes_ : grad_offset);
    return ComputeMessages(stub(), {HeaderMessage(header), EndMessage(problem_.spec.num_tokens)});
  }

  // The same call under a bearer token; only its status.
  grpc::Status SharedComputeAs(const std::string& token, const std::string& region_id) {
    v1::ComputeHeader header = MakeHeader(problem_, "h", "s", "as-" + token);
    header.mutable_shared()->set_region_id(region_id);
    header.mutable_shared()->set_grad_input_offset(hidden_bytes_);
    grpc::ClientContext context;
    context.AddMetadata("authorization", "Bearer " + token);
    auto stream = stub().Compute(&context);
    stream->Write(HeaderMessage(header));
    stream->Write(EndMessage(problem_.spec.num_tokens));
    stream->WritesDone();
    v1::ComputeResponse response;
    while (stream->Read(&response)) {
    }
    return stream->Finish();
  }

  void ExpectNothingIn(const std::string& session) { ExpectNoContribution(stub(), "h", session); }

  Problem problem_;
  int64_t hidden_bytes_ = 0;
};

TEST_F(SharedMemoryTest, ServerInfoOffersShmToLoopbackCallers) {
  grpc::ClientContext context;
  v1::ServerInfo info;
  ASSERT_TRUE(stub().GetServerInfo(&context, v1::ServerInfoRequest(), &info).ok());
  EXPECT_EQ(info.boot_id(), HostBootId());
  EXPECT_FALSE(info.boot_id().empty());
  EXPECT_THAT(info.local_transports(), ::testing::ElementsAre("shm"));
}

// A retry is the same request whichever way its hidden comes: through
// another region (the client lost its Regions stream) or in messages.
TEST_F(SharedMemoryTest, ARetryMayComeThroughAnotherRegionOrMessages) {
  ShmObject first(2 * hidden_bytes_), second(2 * hidden_bytes_);
  for (ShmObject* object : {&first, &second}) {
    std::memcpy(object->data(), problem_.hidden_bytes.data(), hidden_bytes_);
  }
  RegionStream regions(stub());
  const std::string a = regions.Register(first, 2 * hidden_bytes_);
  const std::string b = regions.Register(second, 2 * hidden_bytes_);
  ASSERT_FALSE(a.empty() || b.empty());
  ComputeOutcome original = SharedCompute(a, "s", "retried");
  ASSERT_TRUE(original.status.ok()) << original.status.error_message();
  ComputeOutcome other_region = SharedCompute(b, "s", "retried");
  ASSERT_TRUE(other_region.status.ok()) << other_region.status.error_message();
  EXPECT_TRUE(other_region.summary.replayed());
  v1::ComputeHeader header = MakeHeader(problem_, "h", "s", "retried");
  header.set_deterministic(true);
  ComputeOutcome by_messages = Compute(stub(), header, problem_);
  ASSERT_TRUE(by_messages.status.ok()) << by_messages.status.error_message();
  EXPECT_TRUE(by_messages.summary.replayed());
  FetchedGrad grad = FetchGrad(stub(), "h", "s");
  ASSERT_TRUE(grad.status.ok()) << grad.status.error_message();
  EXPECT_EQ(grad.header.contributions(), 1);
}

TEST(LocalPeerTest, OnlyLoopbackAndUnixSocketsAreLocal) {
  EXPECT_TRUE(IsLocalPeer("ipv4:127.0.0.1:50051"));
  EXPECT_TRUE(IsLocalPeer("ipv4:127.1.2.3:1"));
  EXPECT_TRUE(IsLocalPeer("ipv6:[::1]:50051"));
  EXPECT_TRUE(IsLocalPeer("unix:/run/flce.sock"));
  EXPECT_FALSE(IsLocalPeer("ipv4:10.0.0.5:50051"));
  EXPECT_FALSE(IsLocalPeer("ipv4:128.0.0.1:50051"));
  EXPECT_FALSE(IsLocalPeer("ipv6:[::ffff:10.0.0.1]:50051"));
  EXPECT_FALSE(IsLocalPeer("ipv4:1127.0.0.1:5"));
}

TEST_F(SharedMemoryTest, SharedCallEqualsTheMessagesCallBitForBit) {
  ShmObject object(2 * hidden_bytes_);
  std::memcpy(object.data(), problem_.hidden_bytes.data(), hidden_bytes_);
  std::memset(object.data() + hidden_bytes_, 0xff, hidden_bytes_);  // NaN: unwritten shows
  RegionStream regions(stub());
  const std::string id = regions.Register(object, 2 * hidden_bytes_);
  ASSERT_FALSE(id.empty());

  v1::ComputeHeader header = MakeHeader(problem_, "h", "messages", "m1");
  header.set_deterministic(true);
  ComputeOptions in_one_piece;  // as the server reads the region (8 MiB pieces)
  in_one_piece.rows_per_chunk = problem_.spec.num_tokens;
  in_one_piece.shuffle = false;
  ComputeOutcome by_messages = Compute(stub(), header, problem_, in_one_piece);
  ASSERT_TRUE(by_messages.status.ok()) << by_messages.status.error_message();
  ComputeOutcome shared = SharedCompute(id, "shared", "s1");
  ASSERT_TRUE(shared.status.ok()) << shared.status.error_message();

  EXPECT_EQ(shared.summary.loss(), by_messages.summary.loss());
  EXPECT_TRUE(shared.summary.committed());
  EXPECT_EQ(shared.grad_messages, 0);  // grad_input went into the region
  EXPECT_EQ(std::memcmp(object.data() + hidden_bytes_, by_messages.grad_input.data(),
                        hidden_bytes_),
            0);
  FetchedGrad a = FetchGrad(stub(), "h", "messages");
  FetchedGrad b = FetchGrad(stub(), "h", "shared");
  ASSERT_TRUE(a.status.ok() && b.status.ok());
  EXPECT_EQ(a.weight, b.weight);

  // The landing rules hold: a replay with the same id is not applied again.
  ComputeOutcome again = SharedCompute(id, "shared", "s1");
  ASSERT_TRUE(again.status.ok());
  EXPECT_TRUE(again.summary.replayed());
  EXPECT_EQ(FetchGrad(stub(), "h", "shared").header.contributions(), 1);
}

TEST_F(SharedMemoryTest, BadRequestsAreRefusedAndLandNothing) {
  ShmObject object(2 * hidden_bytes_);
  std::memcpy(object.data(), problem_.hidden_bytes.data(), hidden_bytes_);
  RegionStream regions(stub());
  const std::string id = regions.Register(object, 2 * hidden_bytes_);
  ASSERT_FALSE(id.empty());

  ComputeOutcome unknown = SharedCompute("r-0000", "s", "a");
  EXPECT_EQ(unknown.status.error_code(), grpc::StatusCode::NOT_FOUND);
  ComputeOutcome outside = SharedCompute(id, "s", "b", /*hidden_offset=*/hidden_bytes_ + 1, 0);
  EXPECT_EQ(outside.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(outside.status.error_message(), HasSubstr("outside the region"));
  ComputeOutcome negative = SharedCompute(id, "s", "c", -8);
  EXPECT_EQ(negative.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  ComputeOutcome overlap = SharedCompute(id, "s", "d", 0, hidden_bytes_ / 2);
  EXPECT_EQ(overlap.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(overlap.status.error_message(), HasSubstr("overlaps"));

  v1::ComputeHeader header = MakeHeader(problem_, "h", "s", "e");
  header.mutable_shared()->set_region_id(id);
  header.mutable_shared()->set_grad_input_offset(hidden_bytes_);
  ComputeOutcome chunk = ComputeMessages(
      stub(), {HeaderMessage(header), HiddenMessage(0, problem_.hidden_bytes.substr(0, 256)),
               EndMessage(problem_.spec.num_tokens)});
  EXPECT_EQ(chunk.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(chunk.status.error_message(), HasSubstr("whose hidden is in a region"));
  ComputeOutcome no_end = ComputeMessages(stub(), {HeaderMessage(header)});
  EXPECT_EQ(no_end.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(no_end.status.error_message(), HasSubstr("without an end message"));
  ExpectNothingIn("s");
}

TEST_F(SharedMemoryTest, RegistrationRefusalsEndTheStream) {
  ShmObject object(4096);
  grpc::Status status;
  {
    RegionStream regions(stub());
    EXPECT_TRUE(regions.Register("not-flce", 4096, object.Key(), &status).empty());
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(status.error_message(), HasSubstr("32 lowercase hex digits"));
  }
  {
    RegionStream regions(stub());
    EXPECT_TRUE(regions.Register(object, 8192, &status).empty());
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(status.error_message(), HasSubstr("fewer than the 8192 registered"));
  }
  {
    RegionStream regions(stub());
    EXPECT_TRUE(
        regions.Register("flce-0123456789abcdef0123456789abcdef", 16, object.Key(), &status)
            .empty());
    EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  }
  {
    RegionStream regions(stub());
    EXPECT_TRUE(regions.Register(object, 0, &status).empty());
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  }
  // Someone who saw the name in /dev/shm but cannot read the object does not
  // know its first 16 bytes.
  std::memcpy(object.data(), "0123456789abcdef", 16);
  {
    RegionStream regions(stub());
    EXPECT_TRUE(regions.Register(object.name(), 4096, std::string(16, 'x'), &status).empty());
    EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
    EXPECT_THAT(status.error_message(), HasSubstr("not the key sent"));
  }
  {
    RegionStream regions(stub());
    EXPECT_TRUE(regions.Register(object.name(), 4096, "0123", &status).empty());
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(status.error_message(), HasSubstr("key holds 4 bytes"));
  }
}

TEST_F(SharedMemoryTest, AStreamsEndReleasesItsRegions) {
  ShmObject object(2 * hidden_bytes_);
  std::memcpy(object.data(), problem_.hidden_bytes.data(), hidden_bytes_);
  std::string id;
  {
    RegionStream regions(stub());
    id = regions.Register(object, 2 * hidden_bytes_);
    ASSERT_FALSE(id.empty());
    ASSERT_TRUE(SharedCompute(id, "s", "before").status.ok());
    EXPECT_TRUE(regions.Close().ok());
  }
  ComputeOutcome after = SharedCompute(id, "s", "after");
  EXPECT_EQ(after.status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(after.status.error_message(), HasSubstr("stream ended"));
}

TEST_F(SharedMemoryTest, ATruncatedRegionFailsTheCallNotTheServer) {
  ShmObject object(2 * hidden_bytes_);
  std::memcpy(object.data(), problem_.hidden_bytes.data(), hidden_bytes_);
  RegionStream regions(stub());
  const std::string id = regions.Register(object, 2 * hidden_bytes_);
  ASSERT_FALSE(id.empty());
  object.Truncate(0);  // the mapping stays, its pages are gone: reading them is SIGBUS
  ComputeOutcome truncated = SharedCompute(id, "s", "t");
  EXPECT_EQ(truncated.status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(truncated.status.error_message(), HasSubstr("shorter than it was registered"));
  ExpectNothingIn("s");
  // The server is fine.
  ComputeOutcome normal = Compute(stub(), MakeHeader(problem_, "h", "s", "n"), problem_);
  EXPECT_TRUE(normal.status.ok()) << normal.status.error_message();
}

class SharedMemoryLeaseTest : public SharedMemoryTest {
 protected:
  void SetUp() override { Start(true, absl::Milliseconds(300)); }
};

TEST_F(SharedMemoryLeaseTest, ASilentStreamLosesItsRegions) {
  ShmObject object(2 * hidden_bytes_);
  std::memcpy(object.data(), problem_.hidden_bytes.data(), hidden_bytes_);
  RegionStream regions(stub());
  const std::string id = regions.Register(object, 2 * hidden_bytes_);
  ASSERT_FALSE(id.empty());
  std::this_thread::sleep_for(std::chrono::milliseconds(700));
  ComputeOutcome late = SharedCompute(id, "s", "late");
  EXPECT_EQ(late.status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(late.status.error_message(), HasSubstr("lease ran out"));
  // And the client hears it: its stream was ended.
  EXPECT_EQ(regions.Close().error_code(), grpc::StatusCode::CANCELLED);
}

// An open registration stream does not hold a shutdown for the whole drain.
TEST_F(SharedMemoryTest, ShutdownEndsRegistrationStreams) {
  ShmObject object(2 * hidden_bytes_);
  RegionStream regions(stub());
  ASSERT_FALSE(regions.Register(object, 2 * hidden_bytes_).empty());
  const absl::Time start = absl::Now();
  server().Shutdown();  // TestConfig: a 5 s drain
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  EXPECT_FALSE(regions.Close().ok());
}

// Regions belong to their tenant: another tenant naming one finds nothing.
class SharedMemoryTenantTest : public SharedMemoryTest {
 protected:
  void SetUp() override {
    tokens_ = std::filesystem::temp_directory_path() /
              absl::StrCat("flce_shm_tokens_", getpid(), "_", counter_++);
    std::ofstream(tokens_) << "tok-alice alice\ntok-bob bob\n";
    ServerConfig config = TestConfig();
    config.shm_transport = true;
    config.auth_token_file = tokens_.string();
    StartServer(config);
    problem_ = MakeProblem(TinyF32Spec());
    hidden_bytes_ = static_cast<int64_t>(problem_.hidden_bytes.size());
    for (const char* token : {"tok-alice", "tok-bob"}) {
      ASSERT_TRUE(UploadHead(stub(), "h", problem_, 3, nullptr, token).ok());
    }
  }
  void TearDown() override {
    SharedMemoryTest::TearDown();
    std::filesystem::remove(tokens_);
  }

  std::filesystem::path tokens_;
  static inline int counter_ = 0;
};

TEST_F(SharedMemoryTenantTest, AnotherTenantsRegionIsNotFound) {
  ShmObject object(2 * hidden_bytes_);
  std::memcpy(object.data(), problem_.hidden_bytes.data(), hidden_bytes_);
  RegionStream alices(stub(), "tok-alice");
  const std::string id = alices.Register(object, 2 * hidden_bytes_);
  ASSERT_FALSE(id.empty());
  grpc::Status bob = SharedComputeAs("tok-bob", id);
  EXPECT_EQ(bob.error_code(), grpc::StatusCode::NOT_FOUND) << bob.error_message();
  grpc::Status alice = SharedComputeAs("tok-alice", id);
  EXPECT_TRUE(alice.ok()) << alice.error_message();
}

class NoSharedMemoryTest : public SharedMemoryTest {
 protected:
  void SetUp() override { Start(false, absl::Seconds(60)); }
};

TEST_F(NoSharedMemoryTest, IsNeitherOfferedNorTaken) {
  grpc::ClientContext context;
  v1::ServerInfo info;
  ASSERT_TRUE(stub().GetServerInfo(&context, v1::ServerInfoRequest(), &info).ok());
  EXPECT_TRUE(info.local_transports().empty());
  ShmObject object(4096);
  RegionStream regions(stub());
  grpc::Status status;
  EXPECT_TRUE(regions.Register(object, 4096, &status).empty());
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(status.error_message(), HasSubstr("--local-transports=shm"));
  ComputeOutcome shared = SharedCompute("r-1", "s", "x");
  EXPECT_EQ(shared.status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  ExpectNothingIn("s");
}

// CUDA IPC needs a GPU engine: on the CPU engine it is neither offered nor
// taken, whatever the flag says, and shm goes on working.
class CudaIpcOnCpuTest : public SharedMemoryTest {
 protected:
  void SetUp() override {
    ServerConfig config = TestConfig();
    config.shm_transport = true;
    config.cuda_ipc_transport = true;
    StartServer(config);
    problem_ = MakeProblem(TinyF32Spec());
    ASSERT_TRUE(UploadHead(stub(), "h", problem_).ok());
    hidden_bytes_ = static_cast<int64_t>(problem_.hidden_bytes.size());
  }
};

TEST_F(CudaIpcOnCpuTest, IsNeitherOfferedNorTakenButShmIs) {
  grpc::ClientContext context;
  v1::ServerInfo info;
  ASSERT_TRUE(stub().GetServerInfo(&context, v1::ServerInfoRequest(), &info).ok());
  EXPECT_THAT(info.local_transports(), ::testing::ElementsAre("shm"));
  EXPECT_TRUE(info.device_uuid().empty());
  {
    RegionStream regions(stub());
    grpc::Status status;
    EXPECT_TRUE(regions.RegisterDevice("", &status).empty());
    EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
    EXPECT_THAT(status.error_message(), HasSubstr("takes no CUDA IPC regions"));
  }
  {
    RegionStream regions(stub());
    grpc::Status status;
    EXPECT_TRUE(regions.RegisterDevice("flce-0123456789abcdef0123456789abcdef", &status).empty());
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(status.error_message(), HasSubstr("send one"));
  }
  ShmObject object(2 * hidden_bytes_);
  std::memcpy(object.data(), problem_.hidden_bytes.data(), hidden_bytes_);
  RegionStream regions(stub());
  const std::string id = regions.Register(object, 2 * hidden_bytes_);
  ASSERT_FALSE(id.empty());
  ComputeOutcome shared = SharedCompute(id, "s", "c1");
  EXPECT_TRUE(shared.status.ok()) << shared.status.error_message();
}

class CudaIpcOnlyOnCpuTest : public SharedMemoryTest {
 protected:
  void SetUp() override {
    ServerConfig config = TestConfig();
    config.cuda_ipc_transport = true;
    StartServer(config);
  }
};

TEST_F(CudaIpcOnlyOnCpuTest, TakesNoRegionsAtAll) {
  grpc::ClientContext context;
  v1::ServerInfo info;
  ASSERT_TRUE(stub().GetServerInfo(&context, v1::ServerInfoRequest(), &info).ok());
  EXPECT_TRUE(info.local_transports().empty());
  RegionStream regions(stub());
  grpc::Status status;
  EXPECT_TRUE(regions.RegisterDevice("", &status).empty());
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(status.error_message(), HasSubstr("cuda_ipc"));
}

// The engine is told which calls' hidden arrives at the wire's pace (in
// messages), so that its plan may keep their chunks small; a region's rows
// are all there at once.
class WirePacedTest : public SharedMemoryTest {
 protected:
  class Recording : public DelegatingEngine {
   public:
    Recording(std::unique_ptr<Engine> inner, WirePacedTest* test)
        : DelegatingEngine(std::move(inner)), test_(test) {}
    absl::StatusOr<std::unique_ptr<ComputeCall>> StartCompute(std::shared_ptr<const Head> head,
                                                              ComputeSpec spec,
                                                              GradInputSink sink) override {
      {
        std::lock_guard<std::mutex> lock(test_->mu_);
        test_->paced_.push_back(spec.wire_paced);
      }
      return DelegatingEngine::StartCompute(std::move(head), std::move(spec), std::move(sink));
    }

   private:
    WirePacedTest* test_;
  };

  void SetUp() override {
    ServerConfig config = TestConfig();
    config.shm_transport = true;
    auto cpu = CreateCpuEngine(EngineConfig{});
    ASSERT_TRUE(cpu.ok()) << cpu.status();
    StartServer(config, std::make_unique<Recording>(std::move(*cpu), this));
    problem_ = MakeProblem(TinyF32Spec());
    ASSERT_TRUE(UploadHead(stub(), "h", problem_).ok());
    hidden_bytes_ = static_cast<int64_t>(problem_.hidden_bytes.size());
  }

  std::mutex mu_;
  std::vector<bool> paced_;
};

TEST_F(WirePacedTest, OnlyCallsInMessagesAreWirePaced) {
  ASSERT_TRUE(Compute(stub(), MakeHeader(problem_, "h", "s", "messages"), problem_).status.ok());
  ShmObject object(2 * hidden_bytes_);
  std::memcpy(object.data(), problem_.hidden_bytes.data(), hidden_bytes_);
  RegionStream regions(stub());
  const std::string id = regions.Register(object, 2 * hidden_bytes_);
  ComputeOutcome shared = SharedCompute(id, "s", "region");
  ASSERT_TRUE(shared.status.ok()) << shared.status.error_message();
  std::lock_guard<std::mutex> lock(mu_);
  EXPECT_EQ(paced_, (std::vector<bool>{true, false}));
}

}  // namespace
}  // namespace flce::server::test
