#include "server/observe/process_metrics.h"

#include <dirent.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "prometheus/client_metric.h"
#include "prometheus/metric_type.h"

namespace flce::server {
namespace {

std::optional<std::string> ReadFile(const char* path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// Seconds since the epoch at which the machine booted (/proc/stat's btime).
std::optional<double> BootTime() {
  std::optional<std::string> stat = ReadFile("/proc/stat");
  if (!stat) return std::nullopt;
  for (absl::string_view line : absl::StrSplit(*stat, '\n')) {
    if (!absl::ConsumePrefix(&line, "btime ")) continue;
    double seconds = 0;
    if (absl::SimpleAtod(line, &seconds)) return seconds;
  }
  return std::nullopt;
}

std::optional<double> ResidentBytes() {
  std::optional<std::string> statm = ReadFile("/proc/self/statm");
  if (!statm) return std::nullopt;
  std::vector<absl::string_view> fields = absl::StrSplit(*statm, ' ', absl::SkipWhitespace());
  double pages = 0;
  if (fields.size() < 2 || !absl::SimpleAtod(fields[1], &pages)) return std::nullopt;
  return pages * static_cast<double>(sysconf(_SC_PAGESIZE));
}

std::optional<double> OpenFds() {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return std::nullopt;
  int64_t count = 0;
  while (const dirent* entry = readdir(dir)) {
    if (entry->d_name[0] != '.') ++count;
  }
  closedir(dir);
  // The directory stream held one descriptor of its own while it was read.
  return static_cast<double>(count - 1);
}

prometheus::MetricFamily Family(const char* name, const char* help, prometheus::MetricType type,
                                double value) {
  prometheus::MetricFamily family;
  family.name = name;
  family.help = help;
  family.type = type;
  prometheus::ClientMetric metric;
  if (type == prometheus::MetricType::Counter) {
    metric.counter.value = value;
  } else {
    metric.gauge.value = value;
  }
  family.metric.push_back(std::move(metric));
  return family;
}

}  // namespace

std::optional<ProcStat> ParseProcStat(absl::string_view text, long clock_ticks_per_second) {
  size_t close = text.rfind(')');
  if (close == absl::string_view::npos || clock_ticks_per_second <= 0) return std::nullopt;
  // Fields from the third on (state); utime, stime and starttime are the
  // 14th, 15th and 22nd (proc(5)).
  std::vector<absl::string_view> fields =
      absl::StrSplit(text.substr(close + 1), absl::ByAnyChar(" \n"), absl::SkipWhitespace());
  constexpr size_t kFirst = 3;
  constexpr size_t kUtime = 14 - kFirst, kStime = 15 - kFirst, kStart = 22 - kFirst;
  double utime = 0, stime = 0, start = 0;
  if (fields.size() <= kStart || !absl::SimpleAtod(fields[kUtime], &utime) ||
      !absl::SimpleAtod(fields[kStime], &stime) || !absl::SimpleAtod(fields[kStart], &start)) {
    return std::nullopt;
  }
  const double ticks = static_cast<double>(clock_ticks_per_second);
  return ProcStat{(utime + stime) / ticks, start / ticks};
}

std::vector<prometheus::MetricFamily> ProcessCollector::Collect() const {
  using prometheus::MetricType;
  std::vector<prometheus::MetricFamily> families;
  if (std::optional<double> rss = ResidentBytes()) {
    families.push_back(Family("process_resident_memory_bytes", "Resident memory size in bytes",
                              MetricType::Gauge, *rss));
  }
  std::optional<std::string> stat_text = ReadFile("/proc/self/stat");
  std::optional<ProcStat> stat =
      stat_text ? ParseProcStat(*stat_text, sysconf(_SC_CLK_TCK)) : std::nullopt;
  if (stat) {
    families.push_back(Family("process_cpu_seconds_total",
                              "User and system CPU time spent in seconds", MetricType::Counter,
                              stat->cpu_seconds));
    if (std::optional<double> boot = BootTime()) {
      families.push_back(Family("process_start_time_seconds",
                                "Start time of the process since the Unix epoch in seconds",
                                MetricType::Gauge, *boot + stat->start_after_boot_s));
    }
  }
  if (std::optional<double> fds = OpenFds()) {
    families.push_back(
        Family("process_open_fds", "Number of open file descriptors", MetricType::Gauge, *fds));
  }
  return families;
}

}  // namespace flce::server
