// The server's checks of hidden rows as they arrive: that every value is
// finite, and their fingerprint (request_fingerprint.h), taken row by row in
// one pass, so that each row is read from memory once and checked while it
// is in cache. Two passes over a whole message read every byte from memory
// twice, on the thread that feeds the engine (docs/perf/python.md).
//
//   HiddenRowsCheck c = CheckHiddenRows(dtype, data, rows, hidden, offset, true);
//   if (c.first_non_finite >= 0) refuse;  else fingerprint += c.fingerprint;
#ifndef FLCE_SERVER_VALIDATE_HIDDEN_ROWS_CHECK_H_
#define FLCE_SERVER_VALIDATE_HIDDEN_ROWS_CHECK_H_

#include <cstdint>

#include "core/dtype.h"

namespace flce::server {

struct HiddenRowsCheck {
  // The first NaN or Inf, as an element index from the first row's first
  // element (row * hidden + column); -1 when every value is finite.
  int64_t first_non_finite = -1;
  // HiddenFingerprint of the rows (with `fingerprint` asked for and every
  // value finite; the rows before the bad one otherwise).
  uint64_t fingerprint = 0;
};

// `rows` rows of `hidden` values of `dtype` at `data`, the first of them token
// `first_token`.
HiddenRowsCheck CheckHiddenRows(DType dtype, const void* data, int64_t rows, int64_t hidden,
                                int64_t first_token, bool fingerprint);

}  // namespace flce::server

#endif  // FLCE_SERVER_VALIDATE_HIDDEN_ROWS_CHECK_H_
