#include "server/handlers/grad_input_sender.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "server/validate/validation.h"

namespace flce::server {

GradInputSender::GradInputSender(DType dtype, int64_t hidden_size, Send send)
    : dtype_(dtype), hidden_size_(hidden_size), send_(std::move(send)), thread_([this] { Run(); }) {}

GradInputSender::~GradInputSender() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void GradInputSender::Post(int64_t token_offset, int64_t rows, std::string data) {
  absl::MutexLock lock(&mu_);
  queue_.push_back(Piece{token_offset, rows, std::move(data)});
}

absl::Status GradInputSender::Drain() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](GradInputSender* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu_) {
        return s->queue_.empty() && !s->busy_;
      },
      this));
  return status_;
}

absl::Status GradInputSender::status() {
  absl::MutexLock lock(&mu_);
  return status_;
}

void GradInputSender::Run() {
  while (true) {
    Piece piece;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](GradInputSender* s)
               ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu_) { return s->stop_ || !s->queue_.empty(); },
          this));
      if (stop_) return;
      piece = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
    }
    const int64_t bad = FirstNonFinite(dtype_, piece.data.data(), piece.rows * hidden_size_);
    absl::MutexLock lock(&mu_);
    if (bad >= 0 && status_.ok()) {
      status_ = NonFiniteGradInputError(piece.token_offset + bad / hidden_size_,
                                        bad % hidden_size_);
    }
    if (status_.ok()) {
      // Sent under the lock: Drain() returns only once the transport has it.
      send_(piece.token_offset, piece.rows, std::move(piece.data));
    }
    busy_ = false;
  }
}

}  // namespace flce::server
