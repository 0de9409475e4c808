#include "server/state/staging_budget.h"

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"

namespace flce::server {
namespace {

// How often a waiting call looks whether its client is still there.
constexpr absl::Duration kPollInterval = absl::Milliseconds(50);

// Exact, and readable at a glance: whole MiB alone would call 0.7 MiB "0 MiB".
std::string Bytes(int64_t bytes) {
  return absl::StrFormat("%d bytes (%.2f MiB)", bytes, static_cast<double>(bytes) / (1 << 20));
}

}  // namespace

StagingReservation::StagingReservation(StagingReservation&& other) noexcept
    : budget_(std::exchange(other.budget_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

StagingReservation& StagingReservation::operator=(StagingReservation&& other) noexcept {
  if (this != &other) {
    Release();
    budget_ = std::exchange(other.budget_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

StagingReservation::~StagingReservation() { Release(); }

void StagingReservation::Release() {
  if (budget_ != nullptr) budget_->Release(bytes_);
  budget_ = nullptr;
  bytes_ = 0;
}

StagingBudget::StagingBudget(int64_t capacity_bytes, int64_t max_waiting)
    : capacity_(capacity_bytes), max_waiting_(max_waiting) {}

int64_t StagingBudget::in_use() const {
  absl::MutexLock lock(&mu_);
  return in_use_;
}

int64_t StagingBudget::waiting() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(queue_.size());
}

absl::StatusOr<StagingReservation> StagingBudget::Acquire(int64_t bytes, absl::Time deadline,
                                                          const std::function<absl::Status()>& alive) {
  absl::MutexLock lock(&mu_);
  if (capacity_ <= 0) {
    in_use_ += bytes;
    return StagingReservation(this, bytes);
  }
  if (bytes > capacity_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "this call's fp32 staging buffer (", Bytes(bytes), ") is larger than all staging memory, ",
        "--max-staging-mb=", capacity_ >> 20));
  }
  if (queue_.empty() && in_use_ + bytes <= capacity_) {
    in_use_ += bytes;
    return StagingReservation(this, bytes);
  }
  if (static_cast<int64_t>(queue_.size()) >= max_waiting_) {
    return absl::ResourceExhaustedError(
        absl::StrCat(queue_.size(), " calls already wait for staging memory (", Bytes(in_use_),
                     " of --max-staging-mb=", capacity_ >> 20,
                     " in use), --max-queued-calls=", max_waiting_));
  }
  const uint64_t ticket = next_ticket_++;
  queue_.push_back(ticket);
  auto my_turn = [this, ticket, bytes]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return queue_.front() == ticket && in_use_ + bytes <= capacity_;
  };
  absl::Status failed;
  while (!my_turn()) {
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      failed = absl::DeadlineExceededError(absl::StrCat(
          "the call's deadline passed while it waited for staging memory (", Bytes(in_use_),
          " of --max-staging-mb=", capacity_ >> 20, " in use)"));
      break;
    }
    mu_.AwaitWithDeadline(absl::Condition(&my_turn), std::min(deadline, now + kPollInterval));
    if (my_turn() || absl::Now() >= deadline) continue;
    absl::Status status = alive();
    if (!status.ok()) {
      failed = absl::Status(status.code(), absl::StrCat(status.message(),
                                                        " (while it waited for staging memory)"));
      break;
    }
  }
  queue_.erase(std::find(queue_.begin(), queue_.end(), ticket));
  if (!failed.ok()) return failed;
  in_use_ += bytes;
  return StagingReservation(this, bytes);
}

void StagingBudget::Release(int64_t bytes) {
  absl::MutexLock lock(&mu_);
  in_use_ -= bytes;
}

}  // namespace flce::server
