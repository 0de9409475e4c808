// The standard Prometheus process metrics of this process, read from /proc at
// scrape time (prometheus-cpp 1.0 ships no process collector):
//   process_resident_memory_bytes   /proc/self/statm, resident pages x page size
//   process_cpu_seconds_total       /proc/self/stat, utime + stime
//   process_open_fds                entries of /proc/self/fd
//   process_start_time_seconds      /proc/self/stat starttime + /proc/stat btime
// A value that cannot be read (no /proc) is left out rather than reported as 0.
//
// Usage:
//   auto process = std::make_shared<ProcessCollector>();
//   exposer.RegisterCollectable(process);
#ifndef FLCE_SERVER_OBSERVE_PROCESS_METRICS_H_
#define FLCE_SERVER_OBSERVE_PROCESS_METRICS_H_

#include <optional>
#include <vector>

#include "absl/strings/string_view.h"
#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"

namespace flce::server {

struct ProcStat {
  double cpu_seconds = 0;         // utime + stime
  double start_after_boot_s = 0;  // starttime
};

// Parses /proc/<pid>/stat text: the fields after the command name, which may
// itself hold spaces and parentheses (hence the search for the last ')').
std::optional<ProcStat> ParseProcStat(absl::string_view text, long clock_ticks_per_second);

class ProcessCollector : public prometheus::Collectable {
 public:
  std::vector<prometheus::MetricFamily> Collect() const override;
};

}  // namespace flce::server

#endif  // FLCE_SERVER_OBSERVE_PROCESS_METRICS_H_
