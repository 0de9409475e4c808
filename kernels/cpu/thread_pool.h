// A fixed pool of worker threads for the CPU engine's row passes.
// ParallelFor hands out [0, n) in blocks of `grain` to whichever thread is
// free (a shared machine deschedules threads; a static split would wait for
// the slowest). Callers make each block's result independent of the thread
// that runs it, so results stay bitwise repeatable.
#ifndef FLCE_KERNELS_CPU_THREAD_POOL_H_
#define FLCE_KERNELS_CPU_THREAD_POOL_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace flce::cpu {

class ThreadPool {
 public:
  // threads >= 1; the calling thread is one of them, so threads - 1 workers.
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Runs fn(thread_index, begin, end) over blocks of [0, n) of at most
  // `grain` elements and returns when all are done; thread_index < threads()
  // names per-thread scratch. Not reentrant: one caller at a time.
  void ParallelFor(int64_t n, int64_t grain,
                   const std::function<void(int, int64_t, int64_t)>& fn);

 private:
  void WorkerLoop(int index);
  void RunBlocks(int index);

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  const std::function<void(int, int64_t, int64_t)>* fn_ = nullptr;  // guarded by mu_
  int64_t n_ = 0;
  int64_t grain_ = 1;
  std::atomic<int64_t> next_{0};
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
};

}  // namespace flce::cpu

#endif  // FLCE_KERNELS_CPU_THREAD_POOL_H_
