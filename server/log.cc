#include "server/log.h"

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

namespace flce::server {
namespace {

std::atomic<bool> g_quiet{false};

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
  std::string line =
      absl::StrCat(absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::Now(), absl::UTCTimeZone()), " ",
                   LevelLetter(level), " flce-server: ", message, "\n");
  if (logger.sink) {
    logger.sink(line);
    return;
  }
  // One write() per line: lines never interleave with other writers of stderr.
  ssize_t unused = write(STDERR_FILENO, line.data(), line.size());
  (void)unused;
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

void SetLogQuiet(bool quiet) { g_quiet.store(quiet); }

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
  if (level == LogLevel::kInfo && g_quiet.load()) return;
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
  if (level == LogLevel::kInfo && g_quiet.load()) return;
  Logger& logger = TheLogger();
  absl::MutexLock lock(&logger.mu);
  WriteLocked(logger, level, message);
}

void InstallProtobufLogHandler() {
  static std::once_flag once;
  std::call_once(once, [] { google::protobuf::SetLogHandler(&ProtobufLog); });
}

}  // namespace flce::server
