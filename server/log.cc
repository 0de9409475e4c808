#include "server/log.h"

#include <unistd.h>

#include <atomic>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace flce::server {
namespace {

std::atomic<bool> g_quiet{false};

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

}  // namespace

void SetLogQuiet(bool quiet) { g_quiet.store(quiet); }

void Log(LogLevel level, absl::string_view message) {
  if (level == LogLevel::kInfo && g_quiet.load()) return;
  std::string line =
      absl::StrCat(absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::Now(), absl::UTCTimeZone()), " ",
                   LevelLetter(level), " flce-server: ", message, "\n");
  // One write() per line: concurrent lines never interleave.
  ssize_t unused = write(STDERR_FILENO, line.data(), line.size());
  (void)unused;
}

}  // namespace flce::server
