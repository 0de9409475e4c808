// Rows of a streamed tensor (grad_W, a head's weight, embedding rows,
// grad_input, per-token outputs) placed by their offsets into one buffer, each
// checked, so that a missing, repeated or misplaced piece from the server
// cannot pass as data.
#ifndef FLCE_CLIENT_CPP_ROW_ASSEMBLER_H_
#define FLCE_CLIENT_CPP_ROW_ASSEMBLER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace flce {

class RowAssembler {
 public:
  RowAssembler() = default;
  // `rows` rows of `row_bytes` each into *buffer (resized to fit); `name`
  // names them in errors.
  RowAssembler(const char* name, int64_t rows, int64_t row_bytes, std::string* buffer);
  // Into memory the caller sized to rows x row_bytes (nullptr where nothing
  // will be placed).
  RowAssembler(const char* name, int64_t rows, int64_t row_bytes, void* dst);

  // INTERNAL when [at, at + n) is outside, repeats a row or data is not n rows.
  absl::Status Place(int64_t at, int64_t n, absl::string_view data);
  // Where rows [at, at + n) go, counted as placed: the caller writes them
  // there (a socket's read). INTERNAL as Place.
  absl::StatusOr<char*> Reserve(int64_t at, int64_t n);
  int64_t row_bytes() const { return row_bytes_; }
  bool complete() const { return received_ == rows_; }
  // DATA_LOSS naming how many rows never came, and the first of them.
  absl::Status CheckComplete(absl::string_view what) const;
  bool any() const { return received_ > 0; }

 private:
  absl::Status CheckRange(int64_t at, int64_t n) const;

  const char* name_ = "";
  int64_t rows_ = 0;
  int64_t row_bytes_ = 0;
  char* dst_ = nullptr;
  std::vector<uint8_t> seen_;
  int64_t received_ = 0;
};

}  // namespace flce

#endif  // FLCE_CLIENT_CPP_ROW_ASSEMBLER_H_
