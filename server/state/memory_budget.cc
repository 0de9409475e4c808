#include "server/state/memory_budget.h"

#include <unistd.h>

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace flce::server {
namespace {

int64_t Share(double share, int64_t bytes) {
  return static_cast<int64_t>(share * static_cast<double>(bytes));
}

std::string Budget(const char* what, int64_t bytes, const char* flag, bool defaulted) {
  if (bytes == 0) return absl::StrCat(what, " no limit (", flag, ")");
  return absl::StrCat(what, " ", bytes, " bytes",
                      absl::StrFormat(" (%.2f GiB, ", bytes / double(int64_t{1} << 30)),
                      defaulted ? "default of " : "", flag, ")");
}

}  // namespace

int64_t HostMemoryBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGESIZE);
  int64_t bytes = 0;
  if (pages <= 0 || page_size <= 0 ||
      __builtin_mul_overflow(static_cast<int64_t>(pages), static_cast<int64_t>(page_size),
                             &bytes)) {
    return 0;
  }
  return bytes;
}

absl::StatusOr<MemoryBudgets> ResolveMemoryBudgets(const ServerConfig& config,
                                                   const EngineInfo& engine,
                                                   int64_t host_memory_bytes) {
  MemoryBudgets out;
  out.device_memory = engine.device_memory_total > 0;
  out.memory_bytes = out.device_memory ? engine.device_memory_total
                                       : std::max<int64_t>(host_memory_bytes, 0);
  out.staging_default = config.max_staging_bytes < 0;
  out.head_default = config.max_head_bytes < 0;
  out.upload_default = config.max_upload_bytes < 0;
  const int64_t available =
      std::max<int64_t>(out.memory_bytes - std::max<int64_t>(engine.workspace_budget_bytes, 0), 0);

  if (out.memory_bytes == 0) {
    // Nothing to take a share of: a defaulted budget cannot be stated, so it
    // is no limit (and the log line says so).
    out.staging_bytes = out.staging_default ? 0 : config.max_staging_bytes;
    out.head_bytes = out.head_default ? 0 : config.max_head_bytes;
  } else {
    out.staging_bytes =
        out.staging_default ? Share(kStagingShare, available) : config.max_staging_bytes;
    if (out.head_default) {
      const double share = out.device_memory ? kDeviceHeadShare : kHostHeadShare;
      out.head_bytes = Share(share, available - out.staging_bytes);
      if (out.head_bytes <= 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "no memory is left for heads: the engine's ", out.device_memory ? "device" : "host",
            " memory is ", out.memory_bytes, " bytes, the workspace (--workspace-mb) takes ",
            engine.workspace_budget_bytes, " and staging (--max-staging-mb) ",
            out.staging_bytes, "; lower them or set --max-head-bytes"));
      }
    } else {
      out.head_bytes = config.max_head_bytes;
    }
  }
  out.upload_bytes = out.upload_default ? out.head_bytes : config.max_upload_bytes;
  return out;
}

std::string DescribeMemoryBudgets(const MemoryBudgets& budgets) {
  std::string source =
      budgets.memory_bytes == 0
          ? "memory size unknown"
          : absl::StrCat("of ", budgets.device_memory ? "device" : "host", " memory ",
                         budgets.memory_bytes, " bytes");
  return absl::StrCat(
      "memory budgets: ", Budget("heads", budgets.head_bytes, "--max-head-bytes", budgets.head_default),
      ", ",
      Budget("uploads in progress", budgets.upload_bytes,
             budgets.upload_default ? "as --max-head-bytes" : "--max-upload-bytes", false),
      ", ",
      Budget("staging", budgets.staging_bytes, "--max-staging-mb", budgets.staging_default), " (",
      source, ")");
}

}  // namespace flce::server
