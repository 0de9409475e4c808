// Memory a client can make the server take before sending data: the default
// head cap (a share of the engine's memory), what unfinished uploads may
// reserve (--max-upload-bytes), and that a declared head costs no resident
// memory until its bytes arrive.
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/state/memory_budget.h"
#include "server/state/upload_budget.h"
#include "tests/server/server_test_util.h"

namespace flce::server::test {
namespace {

using ::flce::test::MakeProblem;
using ::testing::HasSubstr;

constexpr int64_t kMiB = int64_t{1} << 20;
constexpr int64_t kGiB = int64_t{1} << 30;

int64_t ResidentBytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t size = 0;
  int64_t resident = 0;
  statm >> size >> resident;
  return resident * sysconf(_SC_PAGESIZE);
}

v1::UploadHeadRequest Header(const std::string& head_id, int64_t vocab, int64_t hidden) {
  v1::UploadHeadRequest request;
  request.mutable_header()->set_head_id(head_id);
  request.mutable_header()->set_vocab_size(vocab);
  request.mutable_header()->set_hidden_size(hidden);
  request.mutable_header()->set_dtype(v1::DTYPE_FP32);
  return request;
}

// An upload that sends its header and nothing else.
grpc::Status UploadHeaderOnly(v1::Flce::Stub& stub, const std::string& head_id, int64_t vocab,
                              int64_t hidden) {
  grpc::ClientContext context;
  v1::HeadInfo info;
  auto writer = stub.UploadHead(&context, &info);
  writer->Write(Header(head_id, vocab, hidden));
  writer->WritesDone();
  return writer->Finish();
}

bool WaitUntil(const std::function<bool()>& done) {
  for (int i = 0; i < 500; ++i) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

TEST(MemoryBudgetTest, CpuEngineDefaultsAreSharesOfHostMemory) {
  EngineInfo cpu;
  cpu.workspace_budget_bytes = 1 * kGiB;
  MemoryBudgets b = *ResolveMemoryBudgets(ServerConfig(), cpu, 17 * kGiB);
  EXPECT_FALSE(b.device_memory);
  EXPECT_EQ(b.memory_bytes, 17 * kGiB);
  EXPECT_EQ(b.staging_bytes, 4 * kGiB);                                    // 25% of 16
  EXPECT_EQ(b.head_bytes, static_cast<int64_t>(kHostHeadShare * 12 * kGiB));  // of 16 - 4
  EXPECT_EQ(b.upload_bytes, b.head_bytes);
  EXPECT_TRUE(b.head_default && b.upload_default && b.staging_default);
}

TEST(MemoryBudgetTest, CudaEngineDefaultsAreSharesOfDeviceMemoryNotHostMemory) {
  EngineInfo cuda;
  cuda.workspace_budget_bytes = 2 * kGiB;
  cuda.device_memory_total = 130 * kGiB;
  MemoryBudgets b = *ResolveMemoryBudgets(ServerConfig(), cuda, 2048 * kGiB);
  EXPECT_TRUE(b.device_memory);
  EXPECT_EQ(b.staging_bytes, 32 * kGiB);  // 25% of 128
  EXPECT_EQ(b.head_bytes, static_cast<int64_t>(kDeviceHeadShare * 96 * kGiB));
  EXPECT_EQ(b.upload_bytes, b.head_bytes);
}

TEST(MemoryBudgetTest, ExplicitValuesPassThroughAndShapeTheDefaults) {
  EngineInfo cuda;
  cuda.workspace_budget_bytes = 2 * kGiB;
  cuda.device_memory_total = 130 * kGiB;
  ServerConfig config;
  config.max_staging_bytes = 8 * kGiB;
  MemoryBudgets b = *ResolveMemoryBudgets(config, cuda, 0);
  EXPECT_EQ(b.staging_bytes, 8 * kGiB);
  EXPECT_EQ(b.head_bytes, static_cast<int64_t>(kDeviceHeadShare * 120 * kGiB));
  config.max_head_bytes = 0;  // no limit
  config.max_upload_bytes = 3 * kGiB;
  b = *ResolveMemoryBudgets(config, cuda, 0);
  EXPECT_EQ(b.head_bytes, 0);
  EXPECT_EQ(b.upload_bytes, 3 * kGiB);
  EXPECT_FALSE(b.head_default || b.upload_default || b.staging_default);
}

TEST(MemoryBudgetTest, NothingLeftForHeadsIsRefusedNamingTheFlags) {
  EngineInfo cpu;
  cpu.workspace_budget_bytes = 2 * kGiB;
  ServerConfig config;
  config.max_staging_bytes = 6 * kGiB;
  absl::StatusOr<MemoryBudgets> b = ResolveMemoryBudgets(config, cpu, 8 * kGiB);
  ASSERT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(b.status().message(), HasSubstr("--workspace-mb"));
  EXPECT_THAT(b.status().message(), HasSubstr("--max-staging-mb"));
  EXPECT_THAT(b.status().message(), HasSubstr("--max-head-bytes"));
  EXPECT_THAT(b.status().message(), HasSubstr(absl::StrCat(8 * kGiB)));
}

TEST(MemoryBudgetTest, UnknownMemorySizeLeavesDefaultsUnlimitedAndSaysSo) {
  MemoryBudgets b = *ResolveMemoryBudgets(ServerConfig(), EngineInfo(), 0);
  EXPECT_EQ(b.head_bytes, 0);
  EXPECT_EQ(b.upload_bytes, 0);
  EXPECT_EQ(b.staging_bytes, 0);
  EXPECT_THAT(DescribeMemoryBudgets(b), HasSubstr("memory size unknown"));
  EXPECT_THAT(DescribeMemoryBudgets(b), HasSubstr("heads no limit (--max-head-bytes)"));
}

TEST(UploadBudgetTest, ReservationsAreBoundedAndReturnedWhenDropped) {
  UploadBudget budget(100);
  absl::StatusOr<UploadBudget::Reservation> a = budget.Reserve("a", 60);
  ASSERT_TRUE(a.ok());
  absl::StatusOr<UploadBudget::Reservation> b = budget.Reserve("b", 50);
  ASSERT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(b.status().message(), HasSubstr("\"b\" (50 bytes)"));
  EXPECT_THAT(b.status().message(), HasSubstr("hold 60 bytes, --max-upload-bytes=100"));
  {
    UploadBudget::Reservation moved = std::move(*a);
    EXPECT_EQ(budget.reserved(), 60);
  }
  EXPECT_EQ(budget.reserved(), 0);
  EXPECT_TRUE(budget.Reserve("b", 100).ok());
  EXPECT_EQ(budget.reserved(), 0);
  UploadBudget unlimited(0);
  EXPECT_TRUE(unlimited.Reserve("huge", int64_t{1} << 50).ok());
}

class UploadLimitTest : public ServerTest {};

TEST_F(UploadLimitTest, HeaderBeyondMaxUploadBytesIsRefusedBeforeAnyAllocation) {
  ServerConfig config = TestConfig();
  config.max_upload_bytes = kMiB;
  StartServer(config);
  const int64_t rss_before = ResidentBytes();
  grpc::Status status = UploadHeaderOnly(stub(), "big", 131072, 1024);  // 512 MiB of fp32
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("--max-upload-bytes=1048576"));
  EXPECT_THAT(status.error_message(), HasSubstr("536870912 bytes"));
  EXPECT_LT(ResidentBytes() - rss_before, 64 * kMiB);
  // A head within the budget still loads.
  ::flce::test::ProblemSpec ps;
  EXPECT_TRUE(UploadHead(stub(), "small", MakeProblem(ps)).ok());
}

// An upload that sent its header and holds the stream open.
struct HeldUpload {
  grpc::ClientContext context;
  v1::HeadInfo info;
  std::unique_ptr<grpc::ClientWriter<v1::UploadHeadRequest>> writer;
};

TEST_F(UploadLimitTest, UnfinishedUploadHoldsItsBytesWithoutTouchingThemUntilItEnds) {
  ServerConfig config = TestConfig();
  config.max_upload_bytes = 320 * kMiB;
  StartServer(config);
  const int64_t rss_before = ResidentBytes();

  // 256 MiB declared and none sent. A probe of 128 MiB fits alone but not
  // beside it: once a probe is refused, the held header was handled. A probe
  // still in the server when the held header arrives refuses the held upload
  // instead; then the probes are never refused, and the round starts over.
  std::unique_ptr<HeldUpload> held;
  grpc::Status probe;
  bool refused = false;
  for (int round = 0; round < 5 && !refused; ++round) {
    if (held != nullptr) {
      held->context.TryCancel();
      held->writer->Finish().IgnoreError();
    }
    held = std::make_unique<HeldUpload>();
    held->writer = stub().UploadHead(&held->context, &held->info);
    ASSERT_TRUE(held->writer->Write(Header("held", 65536, 1024)));
    for (int i = 0; i < 100 && !refused; ++i) {
      probe = UploadHeaderOnly(stub(), "probe", 32768, 1024);
      refused = probe.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED;
    }
  }
  ASSERT_TRUE(refused) << "never refused: " << probe.error_message();
  EXPECT_THAT(probe.error_message(), HasSubstr("\"probe\" (134217728 bytes)"));
  EXPECT_THAT(probe.error_message(), HasSubstr("hold 268435456 bytes"));
  EXPECT_THAT(probe.error_message(), HasSubstr(absl::StrCat("--max-upload-bytes=", 320 * kMiB)));
  // Before any byte arrived, the declared 256 MiB must not be resident.
  const int64_t grown = ResidentBytes() - rss_before;
  EXPECT_LT(grown, 64 * kMiB) << "resident memory grew by " << grown << " bytes";

  held->context.TryCancel();
  held->writer->Finish().IgnoreError();
  // The cancelled upload's reservation is returned: the probe now gets as
  // far as its missing bytes.
  ASSERT_TRUE(WaitUntil([&] {
    probe = UploadHeaderOnly(stub(), "probe", 32768, 1024);
    return probe.error_code() == grpc::StatusCode::INVALID_ARGUMENT;
  })) << probe.error_message();
  EXPECT_THAT(probe.error_message(), HasSubstr("weight bytes"));
}

TEST_F(UploadLimitTest, UnsetMaxHeadBytesCapsHeadsAtAShareOfTheEnginesMemory) {
  ServerConfig config = TestConfig();
  ASSERT_LT(config.max_head_bytes, 0);
  StartServer(config);
  EngineInfo cpu;
  cpu.workspace_budget_bytes = config.workspace_bytes;
  absl::StatusOr<MemoryBudgets> budgets = ResolveMemoryBudgets(config, cpu, HostMemoryBytes());
  ASSERT_TRUE(budgets.ok()) << budgets.status();
  ASSERT_GT(budgets->head_bytes, 0);
  // 16 TiB: more than the default cap on any host.
  grpc::Status status = UploadHeaderOnly(stub(), "huge", int64_t{1} << 30, 4096);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();
  EXPECT_THAT(status.error_message(),
              HasSubstr(absl::StrCat("--max-head-bytes=", budgets->head_bytes)));
}

}  // namespace
}  // namespace flce::server::test
