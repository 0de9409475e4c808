// The memory limits flce-server enforces, resolved once at start from the
// flags and the engine, so that a server started without them still cannot be
// told to take more memory than its engine has.
//
// The engine's memory is its device memory when it reports some (CUDA), else
// the host's physical memory (CPU engine). Less the workspace budget, a share
// goes to staging buffers, and a share of the rest to resident heads:
//
//   available = memory - workspace
//   staging   = --max-staging-mb,    else kStagingShare x available
//   heads     = --max-head-bytes,    else head share x (available - staging)
//   uploads   = --max-upload-bytes,  else heads
//
// Usage:
//   FLCE_ASSIGN_OR_RETURN(MemoryBudgets budgets,
//                         ResolveMemoryBudgets(config, engine->info(), HostMemoryBytes()));
//   LogInfo(DescribeMemoryBudgets(budgets));
#ifndef FLCE_SERVER_STATE_MEMORY_BUDGET_H_
#define FLCE_SERVER_STATE_MEMORY_BUDGET_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "kernels/engine.h"
#include "server/base/server_config.h"

namespace flce::server {

// Of the engine's memory less its workspace.
inline constexpr double kStagingShare = 0.25;
// Of what staging leaves. Heads are counted in their own dtype (HeadBytes);
// on the GPU that is what they take.
inline constexpr double kDeviceHeadShare = 0.9;
// The CPU engine keeps every head widened to fp32, so a bf16 or fp16 head
// takes twice its counted bytes: half the device share keeps the worst case
// at 90% of what staging leaves.
inline constexpr double kHostHeadShare = 0.45;

struct MemoryBudgets {
  int64_t head_bytes = 0;     // resident heads, all tenants; 0 = no limit
  int64_t upload_bytes = 0;   // what unfinished uploads reserve; 0 = no limit
  int64_t staging_bytes = 0;  // fp32 staging buffers, all sessions; 0 = no limit
  // What the defaults were taken from (for the log line).
  int64_t memory_bytes = 0;   // 0 = unknown: defaulted budgets are 0 (no limit)
  bool device_memory = false;  // the engine's device memory, else host memory
  bool head_default = false;
  bool upload_default = false;
  bool staging_default = false;
};

// The host's physical memory in bytes; 0 when the system does not say.
int64_t HostMemoryBytes();

// Explicit values (>= 0) pass through unchanged; negative ones get the
// defaults above. INVALID_ARGUMENT, naming the flags and the numbers, when
// the workspace and staging leave nothing for heads.
absl::StatusOr<MemoryBudgets> ResolveMemoryBudgets(const ServerConfig& config,
                                                   const EngineInfo& engine,
                                                   int64_t host_memory_bytes);

// One line for the start-up log: each budget, and whether it was defaulted.
std::string DescribeMemoryBudgets(const MemoryBudgets& budgets);

}  // namespace flce::server

#endif  // FLCE_SERVER_STATE_MEMORY_BUDGET_H_
