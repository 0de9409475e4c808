// What unfinished head builds (uploads, file loads) may hold, all together:
// an upload reserves its head's bytes from its header, before the engine
// allocates anything, and gives them back when it finishes, fails or is
// cancelled. Without it a client could declare heads it never sends and
// the server would hold their memory (--max-upload-bytes).
//
// Usage:
//   UploadBudget budget(limit_bytes);               // 0 = no limit
//   FLCE_ASSIGN_OR_RETURN(UploadBudget::Reservation r, budget.Reserve("h1", bytes));
//   ... build the head ...                          // r released when it goes
#ifndef FLCE_SERVER_STATE_UPLOAD_BUDGET_H_
#define FLCE_SERVER_STATE_UPLOAD_BUDGET_H_

#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace flce::server {

class UploadBudget {
 public:
  // Bytes held for one build; returned to the budget when destroyed.
  class Reservation {
   public:
    Reservation() = default;
    Reservation(Reservation&& other) noexcept;
    Reservation& operator=(Reservation&& other) noexcept;
    ~Reservation();
    int64_t bytes() const { return bytes_; }

   private:
    friend class UploadBudget;
    Reservation(UploadBudget* budget, int64_t bytes) : budget_(budget), bytes_(bytes) {}
    void Release();
    UploadBudget* budget_ = nullptr;
    int64_t bytes_ = 0;
  };

  explicit UploadBudget(int64_t limit_bytes = 0) : limit_(limit_bytes) {}
  UploadBudget(const UploadBudget&) = delete;
  UploadBudget& operator=(const UploadBudget&) = delete;

  void SetLimit(int64_t limit_bytes);
  // RESOURCE_EXHAUSTED naming head_id, the bytes, what is held and
  // --max-upload-bytes when they do not fit.
  absl::StatusOr<Reservation> Reserve(absl::string_view head_id, int64_t bytes);
  int64_t reserved() const;

 private:
  void Release(int64_t bytes);

  mutable absl::Mutex mu_;
  int64_t limit_ ABSL_GUARDED_BY(mu_);
  int64_t reserved_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace flce::server

#endif  // FLCE_SERVER_STATE_UPLOAD_BUDGET_H_
