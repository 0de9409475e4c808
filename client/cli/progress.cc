#include "client/cli/progress.h"

#include "absl/strings/str_format.h"

namespace flce::cli {

Progress::Progress(bool enabled, std::ostream& err, std::string label)
    : enabled_(enabled),
      err_(err),
      label_(std::move(label)),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_) {}

Progress::~Progress() {
  if (drawn_) err_ << "\n" << std::flush;
}

void Progress::Update(int64_t done, int64_t total, const std::string& unit) {
  if (!enabled_) return;
  const auto now = std::chrono::steady_clock::now();
  if (done < total && drawn_ && now - last_draw_ < std::chrono::milliseconds(100)) return;
  last_draw_ = now;
  drawn_ = true;
  const double pct = total > 0 ? 100.0 * done / total : 100.0;
  const double seconds = std::chrono::duration<double>(now - start_).count();
  std::string line;
  if (unit == "B") {
    const double mib = 1024.0 * 1024.0;
    line = absl::StrFormat("\r%s: %5.1f%% (%.1f / %.1f MiB, %.0f MB/s)   ", label_, pct, done / mib,
                           total / mib, seconds > 0 ? done / seconds / 1e6 : 0.0);
  } else {
    line = absl::StrFormat("\r%s: %d / %d %s   ", label_, done, total, unit);
  }
  err_ << line << std::flush;
}

}  // namespace flce::cli
