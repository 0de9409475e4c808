#include "server/state/head_gate.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace flce::server {
namespace {

// How often a waiter asks whether its call is still alive.
constexpr absl::Duration kPollInterval = absl::Milliseconds(50);

}  // namespace

HeadGate::Use& HeadGate::Use::operator=(Use&& other) noexcept {
  if (this != &other) {
    Release();
    gate_ = other.gate_;
    other.gate_ = nullptr;
  }
  return *this;
}

void HeadGate::Use::Release() {
  if (gate_ == nullptr) return;
  absl::MutexLock lock(&gate_->mu_);
  --gate_->users_;
  gate_ = nullptr;
}

void HeadGate::Exclusive::Release() {
  if (gate_ == nullptr) return;
  absl::MutexLock lock(&gate_->mu_);
  gate_->step_active_ = false;
  gate_ = nullptr;
}

absl::Status HeadGate::Wait(const absl::Condition& ready, absl::Time deadline, const Alive& alive,
                            const char* what) {
  while (!ready.Eval()) {
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("the call's deadline passed while it waited for ", what));
    }
    mu_.AwaitWithDeadline(ready, std::min(deadline, now + kPollInterval));
    if (ready.Eval() || alive == nullptr) continue;
    absl::Status status = alive();
    if (!status.ok()) {
      return absl::Status(status.code(),
                          absl::StrCat(status.message(), " (while waiting for ", what, ")"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<HeadGate::Use> HeadGate::Enter(absl::Time deadline, const Alive& alive) {
  absl::MutexLock lock(&mu_);
  auto no_step = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !step_active_ && steps_waiting_ == 0;
  };
  absl::Status status =
      Wait(absl::Condition(&no_step), deadline, alive, "an optimizer step on the head");
  if (!status.ok()) return status;
  ++users_;
  return Use(this);
}

absl::StatusOr<HeadGate::Exclusive> HeadGate::Lock(absl::Time deadline, const Alive& alive) {
  absl::MutexLock lock(&mu_);
  ++steps_waiting_;
  auto free = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !step_active_ && users_ == 0; };
  absl::Status status =
      Wait(absl::Condition(&free), deadline, alive, "the compute calls using the head to finish");
  --steps_waiting_;
  if (!status.ok()) return status;
  step_active_ = true;
  return Exclusive(this);
}

int64_t HeadGate::users() const {
  absl::MutexLock lock(&mu_);
  return users_;
}

}  // namespace flce::server
