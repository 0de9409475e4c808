#include "client/cpp/row_assembler.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace flce {
namespace {

char* Sized(std::string* buffer, int64_t bytes) {
  buffer->resize(static_cast<size_t>(bytes));
  return buffer->data();
}

}  // namespace

RowAssembler::RowAssembler(const char* name, int64_t rows, int64_t row_bytes, void* dst)
    : name_(name), rows_(rows), row_bytes_(row_bytes), dst_(static_cast<char*>(dst)),
      seen_(rows, 0) {}

RowAssembler::RowAssembler(const char* name, int64_t rows, int64_t row_bytes, std::string* buffer)
    : RowAssembler(name, rows, row_bytes, Sized(buffer, rows * row_bytes)) {}

absl::Status RowAssembler::CheckRange(int64_t at, int64_t n) const {
  if (at < 0 || n <= 0 || at > rows_ - n) {
    return absl::InternalError(absl::StrCat("server sent ", name_, " rows [", at, ", ", at + n,
                                            ") outside [0, ", rows_, ")"));
  }
  return absl::OkStatus();
}

absl::Status RowAssembler::Place(int64_t at, int64_t n, absl::string_view data) {
  if (absl::Status range = CheckRange(at, n); !range.ok()) return range;
  if (static_cast<int64_t>(data.size()) != n * row_bytes_) {
    return absl::InternalError(absl::StrCat("server sent ", data.size(), " bytes for ", n, " ",
                                            name_, " rows; expected ", n * row_bytes_));
  }
  absl::StatusOr<char*> at_bytes = Reserve(at, n);
  if (!at_bytes.ok()) return at_bytes.status();
  std::memcpy(*at_bytes, data.data(), data.size());
  return absl::OkStatus();
}

absl::StatusOr<char*> RowAssembler::Reserve(int64_t at, int64_t n) {
  if (absl::Status range = CheckRange(at, n); !range.ok()) return range;
  for (int64_t r = at; r < at + n; ++r) {
    if (seen_[r]) {
      return absl::InternalError(absl::StrCat("server sent ", name_, " row ", r, " twice"));
    }
  }
  std::fill(seen_.begin() + at, seen_.begin() + at + n, 1);
  received_ += n;
  return dst_ + at * row_bytes_;
}

absl::Status RowAssembler::CheckComplete(absl::string_view what) const {
  if (received_ == rows_) return absl::OkStatus();
  const int64_t first = std::find(seen_.begin(), seen_.end(), 0) - seen_.begin();
  return absl::DataLossError(absl::StrCat(what, " ended with ", rows_ - received_, " of ", rows_,
                                          " ", name_, " rows missing (first missing: ", first,
                                          ")"));
}

}  // namespace flce
