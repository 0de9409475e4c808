// The memory every Compute call's private fp32 staging buffer (V x H + V)
// takes, bounded in bytes across all sessions: calls still computing and
// contributions staged for Commit hold a reservation; a call that does not
// fit waits in arrival order instead of being refused, up to a queue bound
// and its deadline.
//
// Usage:
//   StagingBudget budget(/*capacity_bytes=*/8 << 30, /*max_waiting=*/256);
//   FLCE_ASSIGN_OR_RETURN(StagingReservation r,
//                         budget.Acquire(bytes, deadline, [&] { return channel->CheckAlive(); }));
//   ... allocate and fill the staging buffer; keep `r` as long as it lives ...
#ifndef FLCE_SERVER_STATE_STAGING_BUDGET_H_
#define FLCE_SERVER_STATE_STAGING_BUDGET_H_

#include <cstdint>
#include <deque>
#include <functional>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace flce::server {

class StagingBudget;

// Bytes held in a StagingBudget; released when destroyed. Move-only.
class StagingReservation {
 public:
  StagingReservation() = default;
  StagingReservation(StagingReservation&& other) noexcept;
  StagingReservation& operator=(StagingReservation&& other) noexcept;
  StagingReservation(const StagingReservation&) = delete;
  StagingReservation& operator=(const StagingReservation&) = delete;
  ~StagingReservation();

  int64_t bytes() const { return bytes_; }
  void Release();

 private:
  friend class StagingBudget;
  StagingReservation(StagingBudget* budget, int64_t bytes) : budget_(budget), bytes_(bytes) {}
  StagingBudget* budget_ = nullptr;
  int64_t bytes_ = 0;
};

class StagingBudget {
 public:
  // capacity_bytes <= 0: no bound. max_waiting: calls that may wait at once.
  StagingBudget(int64_t capacity_bytes, int64_t max_waiting);

  // Waits (first come, first served) until `bytes` fit. RESOURCE_EXHAUSTED
  // when `bytes` exceed the whole capacity or max_waiting calls already wait;
  // DEADLINE_EXCEEDED at `deadline`; what `alive` returns once it is not OK
  // (polled while waiting: the call was cancelled or its deadline passed).
  absl::StatusOr<StagingReservation> Acquire(int64_t bytes, absl::Time deadline,
                                             const std::function<absl::Status()>& alive);

  int64_t capacity() const { return capacity_; }
  int64_t in_use() const;
  int64_t waiting() const;

 private:
  friend class StagingReservation;
  void Release(int64_t bytes);

  const int64_t capacity_;
  const int64_t max_waiting_;
  mutable absl::Mutex mu_;
  int64_t in_use_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_ticket_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<uint64_t> queue_ ABSL_GUARDED_BY(mu_);  // tickets of waiting calls, oldest first
};

}  // namespace flce::server

#endif  // FLCE_SERVER_STATE_STAGING_BUDGET_H_
