#include "server/observe/log.h"

#include <unistd.h>

#include <atomic>
#include <mutex>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "google/protobuf/stubs/logging.h"
#include "nlohmann/json.hpp"
#include "server/observe/request_log.h"

namespace flce::server {
namespace {

std::atomic<LogLevel> g_min_level{LogLevel::kInfo};
std::atomic<LogFormat> g_format{LogFormat::kText};

bool Silenced(LogLevel level) {
  return static_cast<int>(level) < static_cast<int>(g_min_level.load());
}

struct Logger {
  absl::Mutex mu;
  LogRateLimiter limiter ABSL_GUARDED_BY(mu) = LogRateLimiter(LogRateLimit{});
  LogSink sink ABSL_GUARDED_BY(mu);
};

// Never destroyed: detached threads may still log while statics go away.
Logger& TheLogger() {
  static Logger* logger = new Logger();
  return *logger;
}

const char* LevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kInfo:
      return "info";
    case LogLevel::kWarning:
      return "warning";
    case LogLevel::kError:
      return "error";
  }
  return "?";
}

const char* LevelLetter(LogLevel level) {
  switch (level) {
    case LogLevel::kInfo:
      return "I";
    case LogLevel::kWarning:
      return "W";
    case LogLevel::kError:
      return "E";
  }
  return "?";
}

absl::string_view Basename(absl::string_view path) {
  size_t slash = path.rfind('/');
  return slash == absl::string_view::npos ? path : path.substr(slash + 1);
}

std::string Now() {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::Now(), absl::UTCTimeZone());
}

// Writes one whole line (newline included) to the sink or stderr.
void EmitLocked(Logger& logger, const std::string& line) ABSL_EXCLUSIVE_LOCKS_REQUIRED(logger.mu) {
  if (logger.sink) {
    logger.sink(line);
    return;
  }
  // One write() per line: lines never interleave with other writers of stderr.
  ssize_t unused = write(STDERR_FILENO, line.data(), line.size());
  (void)unused;
}

// Client-sent strings need not be UTF-8: replaced, never a broken line.
std::string JsonLine(const nlohmann::json& object) {
  return object.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

void WriteLocked(Logger& logger, LogLevel level, absl::string_view message)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(logger.mu) {
  // Lines quote what clients send (ids, before they are validated): one call
  // must not be able to write megabytes.
  std::string cut;
  if (message.size() > kMaxLogMessageBytes) {
    cut = absl::StrCat(message.substr(0, kMaxLogMessageBytes), "...(",
                       message.size() - kMaxLogMessageBytes, " more bytes)");
    message = cut;
  }
  if (g_format.load() == LogFormat::kJson) {
    EmitLocked(logger, JsonLine({{"time", Now()},
                                 {"level", LevelName(level)},
                                 {"message", std::string(message)}}));
    return;
  }
  EmitLocked(logger, absl::StrCat(Now(), " ", LevelLetter(level), " flce-server: ", message, "\n"));
}

void ProtobufLog(google::protobuf::LogLevel level, const char* filename, int line,
                 const std::string& message) {
  std::string text = absl::StrCat("libprotobuf: ", message);
  if (level >= google::protobuf::LOGLEVEL_FATAL) {
    // The process is about to abort: the reason is never dropped.
    LogUnthrottled(LogLevel::kError, text);
    return;
  }
  LogLevel ours = level == google::protobuf::LOGLEVEL_INFO      ? LogLevel::kInfo
                  : level == google::protobuf::LOGLEVEL_WARNING ? LogLevel::kWarning
                                                                : LogLevel::kError;
  Log(ours, text, filename != nullptr ? filename : "libprotobuf", line);
}

}  // namespace

void SetLogQuiet(bool quiet) { SetLogLevel(quiet ? LogLevel::kWarning : LogLevel::kInfo); }

void SetLogLevel(LogLevel level) { g_min_level.store(level); }

void SetLogFormat(LogFormat format) { g_format.store(format); }

absl::StatusOr<LogLevel> ParseLogLevel(absl::string_view name) {
  if (name == "info") return LogLevel::kInfo;
  if (name == "warning") return LogLevel::kWarning;
  if (name == "error") return LogLevel::kError;
  return absl::InvalidArgumentError(
      absl::StrCat("--log-level=", name, " is not one of info, warning, error"));
}

absl::StatusOr<LogFormat> ParseLogFormat(absl::string_view name) {
  if (name == "text") return LogFormat::kText;
  if (name == "json") return LogFormat::kJson;
  return absl::InvalidArgumentError(absl::StrCat("--log-format=", name, " is not text or json"));
}

void LogRequestLine(LogLevel level, const RequestLogLine& line) {
  if (Silenced(level)) return;
  if (g_format.load() == LogFormat::kText) {
    LogUnthrottled(level, FormatRequestLog(line));
    return;
  }
  nlohmann::json object = {{"time", Now()}, {"level", LevelName(level)}};
  for (auto& [key, value] : RequestLogFields(line)) object[key] = std::move(value);
  Logger& logger = TheLogger();
  absl::MutexLock lock(&logger.mu);
  EmitLocked(logger, JsonLine(object));
}

void SetLogRateLimit(LogRateLimit limit) {
  Logger& logger = TheLogger();
  absl::MutexLock lock(&logger.mu);
  logger.limiter = LogRateLimiter(limit);
}

void SetLogSink(LogSink sink) {
  Logger& logger = TheLogger();
  absl::MutexLock lock(&logger.mu);
  logger.sink = std::move(sink);
}

void Log(LogLevel level, absl::string_view message, const char* file, int line) {
  if (Silenced(level)) return;
  std::string site = absl::StrCat(file, ":", line);
  Logger& logger = TheLogger();
  absl::MutexLock lock(&logger.mu);
  LogRateLimiter::Verdict verdict = logger.limiter.Admit(site, absl::Now());
  if (verdict.suppressed > 0) {
    const LogRateLimit& limit = logger.limiter.limit();
    WriteLocked(
        logger, level,
        absl::StrCat(verdict.suppressed, " line(s) from ", Basename(site), " suppressed over ",
                     absl::FormatDuration(verdict.suppressed_over), " (at most ", limit.lines,
                     " per ", absl::FormatDuration(limit.interval), " from one place)"));
  }
  if (verdict.write) WriteLocked(logger, level, message);
}

void LogUnthrottled(LogLevel level, absl::string_view message) {
  if (Silenced(level)) return;
  Logger& logger = TheLogger();
  absl::MutexLock lock(&logger.mu);
  WriteLocked(logger, level, message);
}

void InstallProtobufLogHandler() {
  static std::once_flag once;
  std::call_once(once, [] { google::protobuf::SetLogHandler(&ProtobufLog); });
}

}  // namespace flce::server
