// What training a resident head needs besides its weight: the gate between
// compute calls and optimizer steps, the optimizer state once created, and
// the outcomes of recent steps by request id (a retried Step applies once).
// One per resident head; replacing the head's weight starts a new one.
#ifndef FLCE_SERVER_STATE_HEAD_TRAINING_STATE_H_
#define FLCE_SERVER_STATE_HEAD_TRAINING_STATE_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "flce/v1/flce.pb.h"
#include "kernels/optimizer.h"
#include "server/state/head_gate.h"

namespace flce::server {

class HeadTrainingState {
 public:
  HeadGate& gate() { return gate_; }

  // Serialises CreateOptimizer and Step on this head.
  absl::Mutex& mu() ABSL_LOCK_RETURNED(mu_) { return mu_; }
  HeadOptimizer* optimizer() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return optimizer_.get(); }
  void set_optimizer(std::unique_ptr<HeadOptimizer> optimizer) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Read without mu (limits, metrics, HeadInfo): set when state is created.
  bool has_optimizer() const { return has_optimizer_.load(); }
  // Bytes the state holds, or has reserved while it is being created
  // (HeadRegistry counts them against --max-head-bytes).
  int64_t state_bytes() const { return state_bytes_.load(); }
  void set_state_bytes(int64_t bytes) { state_bytes_.store(bytes); }

  // What DescribeHead shows: kind, groups, steps, bytes. False without state.
  bool Describe(v1::OptimizerInfo* info) const;
  bool DescribeLocked(v1::OptimizerInfo* info) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CountSkipped() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { ++skipped_; }
  int64_t skipped() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return skipped_; }
  void set_skipped(int64_t skipped) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { skipped_ = skipped; }
  // The LoadCheckpoint request that created this head, so that its retry
  // loads nothing again.
  const std::string& loaded_by() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return loaded_by_; }
  const std::string& loaded_name() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return loaded_name_; }
  void set_loaded_by(std::string request_id, std::string name) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    loaded_by_ = std::move(request_id);
    loaded_name_ = std::move(name);
  }

  // A Step request's earlier outcome, or nullptr.
  struct StepRecord {
    uint64_t fingerprint = 0;
    v1::StepResponse response;
  };
  const StepRecord* FindStep(const std::string& request_id) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RecordStep(const std::string& request_id, StepRecord record)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

 private:
  static constexpr size_t kStepsRemembered = 1024;

  HeadGate gate_;
  mutable absl::Mutex mu_;
  std::unique_ptr<HeadOptimizer> optimizer_ ABSL_GUARDED_BY(mu_);
  int64_t skipped_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, StepRecord> steps_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> step_order_ ABSL_GUARDED_BY(mu_);
  std::string loaded_by_ ABSL_GUARDED_BY(mu_);
  std::string loaded_name_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> has_optimizer_{false};
  std::atomic<int64_t> state_bytes_{0};
};

}  // namespace flce::server

#endif  // FLCE_SERVER_STATE_HEAD_TRAINING_STATE_H_
