// Who may use a head's resident weight right now: any number of compute calls,
// or one optimizer step that rewrites the weight in place (never both). A step
// that asks waits for the calls already in; calls that arrive meanwhile wait
// for the step (their wait shows in timings.wait_ms), so steps never starve.
//
// Usage:
//   FLCE_ASSIGN_OR_RETURN(HeadGate::Use use, gate.Enter(deadline, alive));  // compute
//   FLCE_ASSIGN_OR_RETURN(HeadGate::Exclusive step, gate.Lock(deadline, alive));  // Step
#ifndef FLCE_SERVER_STATE_HEAD_GATE_H_
#define FLCE_SERVER_STATE_HEAD_GATE_H_

#include <cstdint>
#include <functional>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace flce::server {

class HeadGate {
 public:
  // Held by a compute call while it may read the weight. Move-only.
  class Use {
   public:
    Use() = default;
    Use(Use&& other) noexcept : gate_(other.gate_) { other.gate_ = nullptr; }
    Use& operator=(Use&& other) noexcept;
    Use(const Use&) = delete;
    Use& operator=(const Use&) = delete;
    ~Use() { Release(); }
    void Release();

   private:
    friend class HeadGate;
    explicit Use(HeadGate* gate) : gate_(gate) {}
    HeadGate* gate_ = nullptr;
  };

  // Held by a step while it rewrites the weight. Move-only.
  class Exclusive {
   public:
    Exclusive() = default;
    Exclusive(Exclusive&& other) noexcept : gate_(other.gate_) { other.gate_ = nullptr; }
    Exclusive& operator=(Exclusive&&) = delete;
    Exclusive(const Exclusive&) = delete;
    Exclusive& operator=(const Exclusive&) = delete;
    ~Exclusive() { Release(); }
    void Release();

   private:
    friend class HeadGate;
    explicit Exclusive(HeadGate* gate) : gate_(gate) {}
    HeadGate* gate_ = nullptr;
  };

  using Alive = std::function<absl::Status()>;

  // Waits while a step holds or waits for the gate. DEADLINE_EXCEEDED at
  // `deadline`; what `alive` returns once it is not OK (polled while waiting).
  absl::StatusOr<Use> Enter(absl::Time deadline, const Alive& alive);
  // Waits until no compute call and no other step holds the gate.
  absl::StatusOr<Exclusive> Lock(absl::Time deadline, const Alive& alive);

  int64_t users() const;

 private:
  absl::Status Wait(const absl::Condition& ready, absl::Time deadline, const Alive& alive,
                    const char* what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  int64_t users_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t steps_waiting_ ABSL_GUARDED_BY(mu_) = 0;
  bool step_active_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace flce::server

#endif  // FLCE_SERVER_STATE_HEAD_GATE_H_
