// A tiny stderr logger: Debian's Abseil (20220623) has no absl/log, and the
// server needs only timestamped lines an operator can read or grep.
//
// Usage:
//   flce::server::LogInfo(absl::StrCat("listening on ", address));
#ifndef FLCE_SERVER_LOG_H_
#define FLCE_SERVER_LOG_H_

#include "absl/strings/string_view.h"

namespace flce::server {

enum class LogLevel { kInfo, kWarning, kError };

// One line "<UTC time> <I|W|E> flce-server: <message>" on stderr. Thread-safe:
// the line is written with a single write() so lines never interleave.
void Log(LogLevel level, absl::string_view message);

inline void LogInfo(absl::string_view message) { Log(LogLevel::kInfo, message); }
inline void LogWarning(absl::string_view message) { Log(LogLevel::kWarning, message); }
inline void LogError(absl::string_view message) { Log(LogLevel::kError, message); }

// Silences kInfo lines (tests start many servers).
void SetLogQuiet(bool quiet);

}  // namespace flce::server

#endif  // FLCE_SERVER_LOG_H_
