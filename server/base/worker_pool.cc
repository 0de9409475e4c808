#include "server/base/worker_pool.h"

#include <utility>

namespace flce::server {

WorkerPool::WorkerPool(int threads) {
  if (threads < 1) threads = 1;
  threads_.reserve(threads);
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Loop(); });
}

WorkerPool::~WorkerPool() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& t : threads_) t.join();
}

void WorkerPool::Schedule(std::function<void()> task) {
  absl::MutexLock lock(&mu_);
  tasks_.push_back(std::move(task));
}

void WorkerPool::Loop() {
  while (true) {
    std::function<void()> task;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](WorkerPool* pool) ABSL_EXCLUSIVE_LOCKS_REQUIRED(pool->mu_) {
            return pool->stopping_ || !pool->tasks_.empty();
          },
          this));
      if (tasks_.empty()) return;  // stopping and drained
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task();
  }
}

void WorkTracker::Begin() {
  absl::MutexLock lock(&mu_);
  ++active_;
}

void WorkTracker::End() {
  absl::MutexLock lock(&mu_);
  --active_;
}

bool WorkTracker::WaitIdle(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return active_ == 0; };
  return mu_.AwaitWithTimeout(absl::Condition(&idle), timeout);
}

int WorkTracker::active() const {
  absl::MutexLock lock(&mu_);
  return active_;
}

}  // namespace flce::server
