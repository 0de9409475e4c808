// Checks each grad_input piece an engine hands over for NaN and Inf and sends
// it, on a thread of its own: the engine thread that produced the piece never
// waits for the scan (17 ms per 128 MiB of bf16 on one core of the H200 host,
// 15% of a first-shape step when it ran on the engine's thread). A piece that
// is not finite is not sent; the call must then fail (kNonFiniteResult).
//
// Usage:
//   GradInputSender sender(DType::kBF16, H, [&](int64_t offset, int64_t rows,
//                                               std::string data) { ...send... });
//   sink = [&](int64_t offset, int64_t rows, std::string data) {
//     sender.Post(offset, rows, std::move(data));
//   };
//   ... engine call finished ...
//   FLCE_RETURN_IF_ERROR(sender.Drain());
#ifndef FLCE_SERVER_HANDLERS_GRAD_INPUT_SENDER_H_
#define FLCE_SERVER_HANDLERS_GRAD_INPUT_SENDER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "core/dtype.h"

namespace flce::server {

class GradInputSender {
 public:
  using Send = std::function<void(int64_t token_offset, int64_t rows, std::string data)>;

  GradInputSender(DType dtype, int64_t hidden_size, Send send);
  // Stops the thread; pieces not yet checked are dropped.
  ~GradInputSender();
  GradInputSender(const GradInputSender&) = delete;
  GradInputSender& operator=(const GradInputSender&) = delete;

  // From any thread; returns at once.
  void Post(int64_t token_offset, int64_t rows, std::string data);
  // Waits until every posted piece was checked (and sent, if finite); then as status().
  absl::Status Drain();
  // OK, or INVALID_ARGUMENT naming the first token found not finite.
  absl::Status status();

 private:
  struct Piece {
    int64_t token_offset;
    int64_t rows;
    std::string data;
  };
  void Run();

  const DType dtype_;
  const int64_t hidden_size_;
  const Send send_;
  absl::Mutex mu_;
  std::deque<Piece> queue_ ABSL_GUARDED_BY(mu_);
  bool busy_ ABSL_GUARDED_BY(mu_) = false;  // a piece is being checked or sent
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;  // last: starts once the rest is ready
};

}  // namespace flce::server

#endif  // FLCE_SERVER_HANDLERS_GRAD_INPUT_SENDER_H_
