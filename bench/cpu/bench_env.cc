#include "bench/cpu/bench_env.h"

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <fstream>

namespace flce::bench {

std::string CpuModel() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      auto colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(' ', colon + 1));
    }
  }
  return "unknown";
}

namespace {
std::string FormatUtc(const char* format) {
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[64];
  std::strftime(buf, sizeof(buf), format, &tm);
  return buf;
}
}  // namespace

std::string UtcNow() { return FormatUtc("%Y-%m-%dT%H:%M:%SZ"); }
std::string UtcDate() { return FormatUtc("%Y-%m-%d"); }

std::string GitCommit() {
  // The source directory is compiled in; the commit is read when the
  // benchmark runs, not when it was configured.
  const std::string command = std::string("git -C '") + FLCE_SOURCE_DIR +
                              "' rev-parse --short=12 HEAD 2>/dev/null";
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return "unknown";
  char buf[64] = {};
  std::string out;
  if (std::fgets(buf, sizeof(buf), pipe) != nullptr) out = buf;
  pclose(pipe);
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  return out.empty() ? "unknown" : out;
}

double Median(std::vector<double> values) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

}  // namespace flce::bench
