#include "server/validate/hidden_rows_check.h"

#include "server/validate/request_fingerprint.h"

namespace flce::server {

HiddenRowsCheck CheckHiddenRows(DType dtype, const void* data, int64_t rows, int64_t hidden,
                                int64_t first_token, bool fingerprint) {
  HiddenRowsCheck check;
  const int64_t row_bytes = hidden * DTypeSize(dtype);
  const char* row = static_cast<const char*>(data);
  for (int64_t r = 0; r < rows; ++r, row += row_bytes) {
    const int64_t bad = FirstNonFinite(dtype, row, hidden);
    if (bad >= 0) {
      check.first_non_finite = r * hidden + bad;
      return check;
    }
    if (fingerprint) check.fingerprint += HiddenFingerprint(row, 1, row_bytes, first_token + r);
  }
  return check;
}

}  // namespace flce::server
