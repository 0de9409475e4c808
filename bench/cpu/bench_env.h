// Where a benchmark ran: CPU model, date, git commit. Printed beside results
// and stored in their JSON so that numbers can be compared across machines.
#ifndef FLCE_BENCH_CPU_BENCH_ENV_H_
#define FLCE_BENCH_CPU_BENCH_ENV_H_

#include <string>
#include <vector>

namespace flce::bench {

std::string CpuModel();      // /proc/cpuinfo's model name, or "unknown"
std::string UtcNow();        // 2026-11-29T13:40:00Z
std::string UtcDate();       // 2026-11-29
std::string GitCommit();     // HEAD of the source tree, or "unknown"
double Median(std::vector<double> values);

}  // namespace flce::bench

#endif  // FLCE_BENCH_CPU_BENCH_ENV_H_
