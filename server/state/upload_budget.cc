#include "server/state/upload_budget.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace flce::server {

UploadBudget::Reservation::Reservation(Reservation&& other) noexcept
    : budget_(std::exchange(other.budget_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

UploadBudget::Reservation& UploadBudget::Reservation::operator=(Reservation&& other) noexcept {
  if (this != &other) {
    Release();
    budget_ = std::exchange(other.budget_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

UploadBudget::Reservation::~Reservation() { Release(); }

void UploadBudget::Reservation::Release() {
  if (budget_ != nullptr) budget_->Release(bytes_);
  budget_ = nullptr;
  bytes_ = 0;
}

void UploadBudget::SetLimit(int64_t limit_bytes) {
  absl::MutexLock lock(&mu_);
  limit_ = limit_bytes;
}

absl::StatusOr<UploadBudget::Reservation> UploadBudget::Reserve(absl::string_view head_id,
                                                                int64_t bytes) {
  absl::MutexLock lock(&mu_);
  int64_t total = 0;
  if (__builtin_add_overflow(reserved_, bytes, &total) || (limit_ > 0 && total > limit_)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot start loading head \"", head_id, "\" (", bytes, " bytes): unfinished uploads hold ",
        reserved_, " bytes, --max-upload-bytes=", limit_));
  }
  reserved_ = total;
  return Reservation(this, bytes);
}

int64_t UploadBudget::reserved() const {
  absl::MutexLock lock(&mu_);
  return reserved_;
}

void UploadBudget::Release(int64_t bytes) {
  absl::MutexLock lock(&mu_);
  reserved_ -= bytes;
}

}  // namespace flce::server
