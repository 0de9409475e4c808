// A fixed set of worker threads for the work RPC reactions must not do
// themselves (engine calls: head writes, commits, gradient copies).
//
// Usage:
//   WorkerPool pool(4);
//   pool.Schedule([] { ... });   // runs on a worker; the destructor drains
#ifndef FLCE_SERVER_BASE_WORKER_POOL_H_
#define FLCE_SERVER_BASE_WORKER_POOL_H_

#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace flce::server {

class WorkerPool {
 public:
  explicit WorkerPool(int threads);
  ~WorkerPool();  // runs what is queued, then joins
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  void Schedule(std::function<void()> task);

 private:
  void Loop();

  absl::Mutex mu_;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

// Counts work that outlives its RPC reaction (compute workers), so that the
// server can wait for all of it before it destroys the engine.
class WorkTracker {
 public:
  void Begin();
  void End();
  // True when no work is left; false if `timeout` passed first.
  bool WaitIdle(absl::Duration timeout);
  int active() const;

 private:
  mutable absl::Mutex mu_;
  int active_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace flce::server

#endif  // FLCE_SERVER_BASE_WORKER_POOL_H_
