// A call's private fp32 gradient buffer, taken from the staging budget: the
// memory a Compute or EmbedGrad call writes its grad_W contribution into
// before it lands in a session (SessionStore::CompleteContribution).
#ifndef FLCE_SERVER_HANDLERS_STAGING_H_
#define FLCE_SERVER_HANDLERS_STAGING_H_

#include <cstdint>
#include <functional>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kernels/engine.h"
#include "server/handlers/service_context.h"
#include "server/state/session_store.h"

namespace flce::server {

// Waits for staging memory (StagingBudget::Acquire: first come first served,
// bounded by `deadline` and `alive`), then allocates a zeroed buffer shaped
// like the head. *waited_ms: the time spent waiting.
absl::StatusOr<StagedGrad> AcquireStaging(const ServiceContext& ctx, const HeadSpec& spec,
                                          uint64_t head_version, absl::Time deadline,
                                          const std::function<absl::Status()>& alive,
                                          double* waited_ms);

}  // namespace flce::server

#endif  // FLCE_SERVER_HANDLERS_STAGING_H_
