// Early-return helpers for absl::Status (Debian's Abseil 20220623 has none).
#ifndef FLCE_CORE_STATUS_MACROS_H_
#define FLCE_CORE_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define FLCE_CONCAT_INNER_(a, b) a##b
#define FLCE_CONCAT_(a, b) FLCE_CONCAT_INNER_(a, b)

// Returns the status from the enclosing function when it is not OK.
#define FLCE_RETURN_IF_ERROR(expr)                \
  do {                                            \
    ::absl::Status flce_status_ = (expr);         \
    if (!flce_status_.ok()) return flce_status_;  \
  } while (0)

// FLCE_ASSIGN_OR_RETURN(auto x, MakeX()); returns the error, else binds x.
#define FLCE_ASSIGN_OR_RETURN(lhs, expr) \
  FLCE_ASSIGN_OR_RETURN_IMPL_(FLCE_CONCAT_(flce_statusor_, __LINE__), lhs, expr)
#define FLCE_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                \
  if (!tmp.ok()) return tmp.status();               \
  lhs = std::move(*tmp)

#endif  // FLCE_CORE_STATUS_MACROS_H_
