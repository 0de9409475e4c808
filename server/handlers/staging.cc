#include "server/handlers/staging.h"

#include "absl/time/clock.h"
#include "core/status_macros.h"

namespace flce::server {

absl::StatusOr<StagedGrad> AcquireStaging(const ServiceContext& ctx, const HeadSpec& spec,
                                          uint64_t head_version, absl::Time deadline,
                                          const std::function<absl::Status()>& alive,
                                          double* waited_ms) {
  // The engine's buffer is V x H fp32 (+ V for a bias), give or take padding.
  const int64_t bytes = spec.vocab_size * (spec.hidden_size + (spec.has_bias ? 1 : 0)) * 4;
  const absl::Time asked = absl::Now();
  StagedGrad staged;
  FLCE_ASSIGN_OR_RETURN(staged.reservation, ctx.staging->Acquire(bytes, deadline, alive));
  *waited_ms = absl::ToDoubleMilliseconds(absl::Now() - asked);
  FLCE_ASSIGN_OR_RETURN(staged.grad, ctx.engine->NewGradBuffer(spec));
  staged.head_version = head_version;
  return staged;
}

}  // namespace flce::server
