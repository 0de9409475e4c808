// CreateOptimizer, Step and GradNorm: training a resident head where it
// lives, so that no weight or gradient crosses the wire in a training step.
// The handlers' logic, free of gRPC (flce_service.cc wires them up).
//
// A step, in order: the request id's earlier outcome (replayed), optimizer
// state present, expected_head_version, the session settled (no call in
// flight, nothing staged); then it waits until no compute call uses the head
// (new calls wait for it), applies the session's gradient through the
// engine's HeadOptimizer, zeroes that gradient and bumps the head's version.
// Other sessions keep their gradients.
#ifndef FLCE_SERVER_HANDLERS_OPTIMIZER_HANDLERS_H_
#define FLCE_SERVER_HANDLERS_OPTIMIZER_HANDLERS_H_

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "flce/v1/flce.pb.h"
#include "server/handlers/service_context.h"
#include "server/state/auth.h"
#include "server/state/head_gate.h"
#include "server/state/head_registry.h"

namespace flce::server {

// Bytes of the optimizer state `config` keeps for a head of this shape.
int64_t OptimizerStateBytes(const HeadSpec& spec, const OptimizerConfig& config);

// Optimizer state is created, stepped and checkpointed by whoever may replace
// the weight: the tenant that owns the head, or an admin for a shared
// (preloaded) head. PERMISSION_DENIED otherwise.
absl::Status CheckMayTrain(const Principal& who, const HeadEntry& head);

absl::Status CreateHeadOptimizer(const ServiceContext& ctx, const Principal& who,
                                 const v1::CreateOptimizerRequest& request, v1::OptimizerInfo* out);

// deadline / alive: the call's, for the wait on compute calls in flight.
absl::Status StepHead(const ServiceContext& ctx, const Principal& who,
                      const v1::StepRequest& request, absl::Time deadline,
                      const HeadGate::Alive& alive, v1::StepResponse* out);

absl::Status HeadGradNorm(const ServiceContext& ctx, const Principal& who,
                          const v1::GradNormRequest& request, v1::GradNormResponse* out);

}  // namespace flce::server

#endif  // FLCE_SERVER_HANDLERS_OPTIMIZER_HANDLERS_H_
