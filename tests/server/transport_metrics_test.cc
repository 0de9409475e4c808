// flce_compute_calls_total{transport,reason} and flce_region_refusals_total
// {reason}: how each Compute call's hidden travelled and, for messages, why
// its client said it did not use a region; which Regions streams and
// registrations the server refused, and why.
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <memory>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/base/local_transports_flag.h"
#include "server/observe/metrics.h"
#include "tests/server/region_helpers.h"
#include "tests/server/server_test_util.h"

namespace flce::server::test {
namespace {

using ::flce::test::MakeProblem;


class TransportMetricsTest : public ServerTest {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("flce-transport-metrics-" + std::to_string(getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
    ServerConfig config = TestConfig();
    ASSERT_TRUE(ApplyLocalTransportsFlag("auto", config).ok());  // flce-server's default
    config.unix_socket = (dir_ / "s.sock").string();
    config.max_region_bytes_per_tenant = 4 << 20;
    StartServer(config);
    unix_stub_ = v1::Flce::NewStub(
        grpc::CreateChannel("unix:" + config.unix_socket, grpc::InsecureChannelCredentials()));
    problem_ = MakeProblem(TinyF32Spec());
    ASSERT_TRUE(UploadHead(stub(), "h", problem_).ok());
    hidden_bytes_ = static_cast<int64_t>(problem_.hidden_bytes.size());
  }
  void TearDown() override {
    unix_stub_.reset();
    ServerTest::TearDown();
    std::filesystem::remove_all(dir_);
  }

  double Calls(const std::string& transport, const std::string& reason) {
    return Sample(server().metrics_text(),
                  absl::StrCat("flce_compute_calls_total{reason=\"", reason, "\",transport=\"",
                               transport, "\"}"));
  }
  double Refusals(absl::string_view reason) {
    return Sample(server().metrics_text(),
                  absl::StrCat("flce_region_refusals_total{reason=\"", reason, "\"}"));
  }
  // A call in messages whose header says `reason` (as a raw number: a newer
  // client may send one this server does not know).
  ComputeOutcome InMessages(v1::Flce::Stub& stub, const std::string& request_id, int reason) {
    v1::ComputeHeader header = MakeHeader(problem_, "h", "s", request_id);
    header.set_messages_reason(static_cast<v1::MessagesReason>(reason));
    return Compute(stub, header, problem_);
  }

  std::filesystem::path dir_;
  std::unique_ptr<v1::Flce::Stub> unix_stub_;
  Problem problem_;
  int64_t hidden_bytes_ = 0;
};

TEST_F(TransportMetricsTest, EverySeriesIsThereFromTheStart) {
  for (const char* transport : {"messages_tcp", "messages_unix_socket"}) {
    for (const char* reason : {"unspecified", "asked", "not_local", "not_offered", "unsuitable",
                               "refused", "no_room"}) {
      EXPECT_EQ(Calls(transport, reason), 0) << transport << " " << reason;
    }
  }
  EXPECT_EQ(Calls("shm", "region"), 0);
  EXPECT_EQ(Calls("cuda_ipc", "region"), 0);
  for (absl::string_view reason : kRegionRefusalReasons) EXPECT_EQ(Refusals(reason), 0) << reason;
}

TEST_F(TransportMetricsTest, MessagesCountByConnectionAndTheClientsReason) {
  ComputeOutcome asked = InMessages(stub(), "tcp-asked", v1::MESSAGES_REASON_ASKED);
  ASSERT_TRUE(asked.status.ok()) << asked.status.error_message();
  ComputeOutcome no_room = InMessages(*unix_stub_, "unix-no-room", v1::MESSAGES_REASON_NO_ROOM);
  ASSERT_TRUE(no_room.status.ok()) << no_room.status.error_message();
  ComputeOutcome older = InMessages(stub(), "tcp-older", v1::MESSAGES_REASON_UNSPECIFIED);
  ASSERT_TRUE(older.status.ok()) << older.status.error_message();
  ComputeOutcome newer = InMessages(stub(), "tcp-newer", 99);
  ASSERT_TRUE(newer.status.ok()) << newer.status.error_message();

  EXPECT_EQ(Calls("messages_tcp", "asked"), 1);
  EXPECT_EQ(Calls("messages_unix_socket", "no_room"), 1);
  EXPECT_EQ(Calls("messages_unix_socket", "asked"), 0);
  EXPECT_EQ(Calls("messages_tcp", "unspecified"), 2);  // an older client and an unknown value
  // A call refused before its header is accepted is not counted.
  v1::ComputeHeader missing = MakeHeader(problem_, "no-such-head", "s", "missing");
  missing.set_messages_reason(v1::MESSAGES_REASON_ASKED);
  EXPECT_EQ(Compute(stub(), missing, problem_).status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(Calls("messages_tcp", "asked"), 1);
}

TEST_F(TransportMetricsTest, RegionCallsCountAsTheirKind) {
  ShmObject object(2 * hidden_bytes_);
  std::memcpy(object.data(), problem_.hidden_bytes.data(), hidden_bytes_);
  RegionStream regions(*unix_stub_);
  grpc::Status status;
  const std::string id = regions.Register(object, 2 * hidden_bytes_, &status);
  ASSERT_FALSE(id.empty()) << status.error_message();
  v1::ComputeHeader header = MakeHeader(problem_, "h", "s", "through-shm");
  header.mutable_shared()->set_region_id(id);
  header.mutable_shared()->set_grad_input_offset(hidden_bytes_);
  ComputeOutcome out =
      ComputeMessages(*unix_stub_, {HeaderMessage(header), EndMessage(problem_.spec.num_tokens)});
  ASSERT_TRUE(out.status.ok()) << out.status.error_message();
  EXPECT_EQ(Calls("shm", "region"), 1);
  EXPECT_EQ(Calls("messages_unix_socket", "unspecified"), 0);
}

TEST_F(TransportMetricsTest, RefusedRegionsCountByReason) {
  grpc::Status status;
  {
    ShmObject object(1 << 20);
    RegionStream over_tcp(stub());
    EXPECT_TRUE(over_tcp.Register(object, 1 << 20, &status).empty());
    EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  }
  EXPECT_EQ(Refusals("tcp"), 1);

  ShmObject big(5 << 20);
  RegionStream capped(*unix_stub_);
  EXPECT_TRUE(capped.Register(big, 5 << 20, &status).empty());  // over the 4 MiB cap
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(Refusals("tenant_cap"), 1);

  RegionStream bad_name(*unix_stub_);
  EXPECT_TRUE(bad_name.Register("not-an-flce-name", 1 << 20, std::string(16, 'k'), &status)
                  .empty());
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Refusals("invalid"), 1);

  ShmObject object(1 << 20);
  RegionStream wrong_key(*unix_stub_);
  EXPECT_TRUE(wrong_key.Register(object.name(), 1 << 20, std::string(16, 'x'), &status).empty());
  EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(Refusals("open_failed"), 1);

  RegionStream device(*unix_stub_);  // a GPU-less server offers shared memory only
  EXPECT_TRUE(device.RegisterDevice("", &status).empty());
  EXPECT_EQ(Refusals("kind_not_offered"), 1) << status.error_message();
  EXPECT_EQ(Refusals("tcp"), 1);
  RegionStream both(*unix_stub_);
  EXPECT_TRUE(both.RegisterDevice("flce-00000000000000000000000000000000", &status).empty());
  EXPECT_EQ(Refusals("invalid"), 2) << status.error_message();
}

// The reason is for the metrics: a retry that gives another one is the same
// request (applied once).
TEST_F(TransportMetricsTest, TheReasonIsNotPartOfTheRequestsFingerprint) {
  ComputeOutcome first = InMessages(stub(), "retried", v1::MESSAGES_REASON_NOT_OFFERED);
  ASSERT_TRUE(first.status.ok()) << first.status.error_message();
  ComputeOutcome retry = InMessages(*unix_stub_, "retried", v1::MESSAGES_REASON_REFUSED);
  ASSERT_TRUE(retry.status.ok()) << retry.status.error_message();
  EXPECT_TRUE(retry.summary.replayed());
}

}  // namespace
}  // namespace flce::server::test
