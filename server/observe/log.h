// A tiny stderr logger: Debian's Abseil (20220623) has no absl/log, and the
// server needs only timestamped lines an operator can read or grep.
//
// Every call site (file:line, taken from the default arguments) may write at
// most LogRateLimit::lines lines per interval; further lines are dropped and
// the next line written from that site is preceded by one saying how many.
// A client that can make a line appear once per message therefore cannot
// flood the log. libprotobuf's own messages (InstallProtobufLogHandler) go
// the same way, keyed by their file:line in libprotobuf.
//
// Usage:
//   flce::server::LogInfo(absl::StrCat("listening on ", address));
#ifndef FLCE_SERVER_OBSERVE_LOG_H_
#define FLCE_SERVER_OBSERVE_LOG_H_

#include <cstddef>
#include <functional>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/observe/log_rate_limiter.h"

namespace flce::server {

enum class LogLevel { kInfo, kWarning, kError };

// kText: "<UTC time> <I|W|E> flce-server: <message>". kJson: one object per
// line, {"time", "level" ("info"/"warning"/"error"), "message"}, or for a
// request line its fields (LogRequestLine).
enum class LogFormat { kText, kJson };

// "info", "warning", "error" / "text", "json"; INVALID_ARGUMENT otherwise.
absl::StatusOr<LogLevel> ParseLogLevel(absl::string_view name);
absl::StatusOr<LogFormat> ParseLogFormat(absl::string_view name);

// Lines below `level` are not written (--log-level); kInfo by default.
void SetLogLevel(LogLevel level);
void SetLogFormat(LogFormat format);

// Longer messages are cut to this many bytes, and say how many were left out.
inline constexpr size_t kMaxLogMessageBytes = 16384;

// One line "<UTC time> <I|W|E> flce-server: <message>" on stderr, subject to
// its call site's rate limit. Thread-safe: the line is written with a single
// write() so lines never interleave.
void Log(LogLevel level, absl::string_view message, const char* file = __builtin_FILE(),
         int line = __builtin_LINE());

inline void LogInfo(absl::string_view message, const char* file = __builtin_FILE(),
                    int line = __builtin_LINE()) {
  Log(LogLevel::kInfo, message, file, line);
}
inline void LogWarning(absl::string_view message, const char* file = __builtin_FILE(),
                       int line = __builtin_LINE()) {
  Log(LogLevel::kWarning, message, file, line);
}
inline void LogError(absl::string_view message, const char* file = __builtin_FILE(),
                     int line = __builtin_LINE()) {
  Log(LogLevel::kError, message, file, line);
}

// Never rate-limited: for the one line per RPC (request_log), which is the
// record of every call and whose rate the calls themselves bound.
void LogUnthrottled(LogLevel level, absl::string_view message);

struct RequestLogLine;
// The one line of an RPC, in the --log-format: FormatRequestLog's key=value
// text, or a JSON object of RequestLogFields with time and level. Never
// rate-limited.
void LogRequestLine(LogLevel level, const RequestLogLine& line);

// Silences kInfo lines (tests start many servers): SetLogLevel(kWarning), or
// back to kInfo.
void SetLogQuiet(bool quiet);

// Replaces the per-call-site limit and forgets every site's count.
void SetLogRateLimit(LogRateLimit limit);

// Where whole lines (with their newline) go; nullptr = stderr. For tests.
using LogSink = std::function<void(absl::string_view line)>;
void SetLogSink(LogSink sink);

// Routes libprotobuf's warnings and errors (e.g. one per message whose string
// field is not UTF-8) through Log() with its rate limit. Idempotent; the
// server calls it when it starts.
void InstallProtobufLogHandler();

}  // namespace flce::server

#endif  // FLCE_SERVER_OBSERVE_LOG_H_
