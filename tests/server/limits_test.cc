// Limits that must not refuse normal training: many trainers on one session,
// deferred micro-batches staged together, and calls beyond the staging memory
// queued (first come, first served, bounded, with deadlines) instead of refused.
#include <atomic>
#include <chrono>
#include <cmath>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/state/staging_budget.h"
#include "tests/server/server_test_util.h"

namespace flce::server::test {
namespace {

using ::flce::test::MakeProblem;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr int64_t kStagingBytes = 97 * 16 * 4;  // one staging buffer of TinyF32Spec()

class LimitsTest : public ServerTest {
 protected:
  void Start(const ServerConfig& config) {
    StartServer(config);
    problem_ = MakeProblem(TinyF32Spec());
    ASSERT_TRUE(UploadHead(stub(), "h", problem_).ok());
  }
  Problem problem_;
};

TEST_F(LimitsTest, SixteenTrainersEightCallsEachOnOneSessionNoRefusals) {
  Start(TestConfig());  // the defaults
  ComputeOutcome one = Compute(stub(), MakeHeader(problem_, "h", "single", "one"), problem_);
  ASSERT_TRUE(one.status.ok());
  FetchedGrad single = FetchGrad(stub(), "h", "single");

  constexpr int kTrainers = 16, kCalls = 8;
  std::atomic<int> refused{0};
  std::vector<std::thread> trainers;
  for (int t = 0; t < kTrainers; ++t) {
    // Two threads a trainer, so each keeps two calls in flight.
    for (int lane = 0; lane < 2; ++lane) {
      trainers.emplace_back([&, t, lane] {
        for (int c = lane; c < kCalls; c += 2) {
          ComputeOutcome out = Compute(
              stub(),
              MakeHeader(problem_, "h", "shared", "t" + std::to_string(t) + "-" + std::to_string(c)),
              problem_);
          if (!out.status.ok()) {
            ++refused;
            ADD_FAILURE() << out.status.error_message();
          }
        }
      });
    }
  }
  for (std::thread& t : trainers) t.join();
  EXPECT_EQ(refused.load(), 0);
  FetchedGrad shared = FetchGrad(stub(), "h", "shared");
  ASSERT_TRUE(shared.status.ok());
  EXPECT_EQ(shared.header.contributions(), kTrainers * kCalls);
  double err = 0, norm = 0;
  for (size_t i = 0; i < single.weight.size(); ++i) {
    const double want = double{kTrainers * kCalls} * single.weight[i];
    err += (shared.weight[i] - want) * (shared.weight[i] - want);
    norm += want * want;
  }
  EXPECT_LE(std::sqrt(err / norm), 1e-5);
}

TEST_F(LimitsTest, ATrainerStagesEightDeferredMicroBatches) {
  Start(TestConfig());
  for (int i = 0; i < 8; ++i) {
    v1::ComputeHeader header = MakeHeader(problem_, "h", "s", "mb" + std::to_string(i));
    header.set_commit(v1::COMMIT_DEFERRED);
    ComputeOutcome out = Compute(stub(), header, problem_);
    ASSERT_TRUE(out.status.ok()) << i << ": " << out.status.error_message();
    EXPECT_TRUE(out.summary.staged());
  }
  for (int i = 0; i < 8; ++i) {
    ASSERT_TRUE(Commit(stub(), "h", "s", "mb" + std::to_string(i), 0.125f, false).ok());
  }
  FetchedGrad grad = FetchGrad(stub(), "h", "s");
  EXPECT_EQ(grad.header.contributions(), 8);
}

TEST_F(LimitsTest, MaxPendingCountsDeferredContributionsOnly) {
  ServerConfig config = TestConfig();
  config.max_pending = 2;
  Start(config);
  for (int i = 0; i < 2; ++i) {
    v1::ComputeHeader header = MakeHeader(problem_, "h", "s", "d" + std::to_string(i));
    header.set_commit(v1::COMMIT_DEFERRED);
    ASSERT_TRUE(Compute(stub(), header, problem_).status.ok());
  }
  v1::ComputeHeader third = MakeHeader(problem_, "h", "s", "d2");
  third.set_commit(v1::COMMIT_DEFERRED);
  ComputeOutcome out = Compute(stub(), third, problem_);
  EXPECT_EQ(out.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(out.status.error_message(), AllOf(HasSubstr("--max-pending=2"), HasSubstr("commit")));
  // Calls that commit on completion are not counted.
  EXPECT_TRUE(Compute(stub(), MakeHeader(problem_, "h", "s", "c0"), problem_).status.ok());
  ASSERT_TRUE(Commit(stub(), "h", "s", "d0", 1.0f, false).ok());
  EXPECT_TRUE(Compute(stub(), third, problem_).status.ok());
}

// A call that finds all staging memory in use waits for it and then runs.
TEST_F(LimitsTest, CallsBeyondStagingMemoryWaitInsteadOfBeingRefused) {
  ServerConfig config = TestConfig();
  config.max_staging_bytes = kStagingBytes;  // one call at a time
  Start(config);
  ComputeOutcome second;
  std::atomic<bool> second_done{false};
  std::thread waiter;
  ComputeOptions options;
  options.pause_after_chunks = 1;
  options.on_pause = [&] {
    ASSERT_TRUE(WaitForPending(stub(), "s", 1));  // the first call holds the memory
    waiter = std::thread([&] {
      second = Compute(stub(), MakeHeader(problem_, "h", "s", "second"), problem_);
      second_done = true;
    });
    // Long enough for the second call's header to reach the server on a loaded machine.
    std::this_thread::sleep_for(std::chrono::milliseconds(1000));
    EXPECT_FALSE(second_done.load()) << "the second call should wait for staging memory";
  };
  ComputeOutcome first = Compute(stub(), MakeHeader(problem_, "h", "s", "first"), problem_, options);
  waiter.join();
  ASSERT_TRUE(first.status.ok()) << first.status.error_message();
  ASSERT_TRUE(second.status.ok()) << second.status.error_message();
  EXPECT_GE(second.summary.timings().wait_ms(), 300.0) << "the wait shows in wait_ms";
  EXPECT_EQ(FetchGrad(stub(), "h", "s").header.contributions(), 2);
}

TEST_F(LimitsTest, StagingQueueBoundDeadlineAndSizeAreNamed) {
  ServerConfig config = TestConfig();
  config.max_staging_bytes = kStagingBytes;
  config.max_queued_calls = 1;
  Start(config);
  ComputeOutcome waits_too_long, queue_full;
  ComputeOptions options;
  options.pause_after_chunks = 1;
  options.on_pause = [&] {
    ASSERT_TRUE(WaitForPending(stub(), "s", 1));
    ComputeOptions short_deadline;
    short_deadline.deadline = std::chrono::milliseconds(3000);
    std::thread t([&] {
      waits_too_long =
          Compute(stub(), MakeHeader(problem_, "h", "s", "late"), problem_, short_deadline);
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(1000));  // "late" is queued by now
    queue_full = Compute(stub(), MakeHeader(problem_, "h", "s", "full"), problem_);
    t.join();
  };
  ComputeOutcome first = Compute(stub(), MakeHeader(problem_, "h", "s", "first"), problem_, options);
  ASSERT_TRUE(first.status.ok()) << first.status.error_message();
  EXPECT_EQ(waits_too_long.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_EQ(queue_full.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(queue_full.status.error_message(), HasSubstr("--max-queued-calls=1"));
  EXPECT_EQ(FetchGrad(stub(), "h", "s").header.contributions(), 1);
}

TEST_F(LimitsTest, ACallLargerThanAllStagingMemoryIsRefused) {
  ServerConfig config = TestConfig();
  config.max_staging_bytes = kStagingBytes - 4;
  Start(config);
  ComputeOutcome out = Compute(stub(), MakeHeader(problem_, "h", "s", "big"), problem_);
  EXPECT_EQ(out.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(out.status.error_message(), HasSubstr("--max-staging-mb"));
  // Forward-only calls take no staging memory.
  v1::ComputeHeader eval = MakeHeader(problem_, "h", "s", "eval");
  eval.mutable_outputs()->set_forward_only(true);
  EXPECT_TRUE(Compute(stub(), eval, problem_).status.ok());
}

TEST(StagingBudgetTest, FirstComeFirstServedAndReleasedOnDestruction) {
  StagingBudget budget(10, 8);
  auto never = [] { return absl::OkStatus(); };
  const absl::Time far = absl::Now() + absl::Seconds(10);
  absl::StatusOr<StagingReservation> a = budget.Acquire(6, far, never);
  ASSERT_TRUE(a.ok());
  std::atomic<int> granted{0};
  std::thread b([&] {
    absl::StatusOr<StagingReservation> r = budget.Acquire(6, far, never);
    ASSERT_TRUE(r.ok());
    ++granted;
  });
  while (budget.waiting() < 1) std::this_thread::yield();
  // 3 bytes would fit now, but b came first.
  std::thread c([&] {
    absl::StatusOr<StagingReservation> r = budget.Acquire(3, far, never);
    ASSERT_TRUE(r.ok());
    ++granted;
  });
  while (budget.waiting() < 2) std::this_thread::yield();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(granted.load(), 0) << "c fits beside a, but waits behind b";
  a->Release();
  b.join();
  c.join();
  EXPECT_EQ(granted.load(), 2);
  EXPECT_EQ(budget.in_use(), 0);

  std::atomic<bool> gone{false};
  absl::StatusOr<StagingReservation> held = budget.Acquire(10, far, never);
  std::thread d([&] {
    absl::StatusOr<StagingReservation> r = budget.Acquire(
        1, far, [&] { return gone ? absl::CancelledError("gone") : absl::OkStatus(); });
    EXPECT_EQ(r.status().code(), absl::StatusCode::kCancelled);
  });
  gone = true;
  d.join();
  EXPECT_EQ(budget.waiting(), 0);
}

// Sizes below a MiB are said exactly, not rounded to whole MiB ("0 MiB in use").
TEST(StagingBudgetTest, RefusalsSayTheBytesExactly) {
  const int64_t capacity = int64_t{1} << 20;  // --max-staging-mb=1
  StagingBudget budget(capacity, /*max_waiting=*/0);
  auto never = [] { return absl::OkStatus(); };
  const absl::Time far = absl::Now() + absl::Seconds(10);
  absl::StatusOr<StagingReservation> big = budget.Acquire(1342177, far, never);
  EXPECT_EQ(big.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(big.status().message(),
              AllOf(HasSubstr("(1342177 bytes (1.28 MiB)) is larger than all staging memory"),
                    HasSubstr("--max-staging-mb=1")));
  absl::StatusOr<StagingReservation> held = budget.Acquire(807404, far, never);
  ASSERT_TRUE(held.ok());
  absl::StatusOr<StagingReservation> queued = budget.Acquire(524288, far, never);
  EXPECT_EQ(queued.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(queued.status().message(), HasSubstr("807404 bytes (0.77 MiB) of --max-staging-mb=1"));
}

}  // namespace
}  // namespace flce::server::test
