#include "server/handlers/optimizer_handlers.h"

#include <cmath>
#include <functional>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "flce/v1/convert.h"
#include "server/observe/metrics.h"
#include "server/state/head_registry.h"
#include "server/state/session_store.h"
#include "server/validate/session_id.h"
#include "server/validate/validation.h"

namespace flce::server {
namespace {

absl::Status CheckFactor(const char* field, double value) {
  if (std::isfinite(value) && value >= 0.0 && value <= 1e12) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(field, " = ", value, " must be finite and in [0, 1e12]"));
}

// What identifies a Step request besides its id: a reused id with other
// values is refused rather than answered with the first outcome.
uint64_t StepFingerprint(const v1::StepRequest& request) {
  v1::StepRequest key = request;
  key.clear_request_id();
  key.clear_expected_head_version();
  return std::hash<std::string>()(key.SerializeAsString());
}

v1::StepOutcome ToProto(StepResult result) {
  switch (result) {
    case StepResult::kApplied:
      return v1::STEP_APPLIED;
    case StepResult::kNonFiniteGradient:
      return v1::STEP_SKIPPED_NON_FINITE_GRADIENT;
    case StepResult::kNonFiniteWeight:
      return v1::STEP_SKIPPED_NON_FINITE_WEIGHT;
  }
  return v1::STEP_OUTCOME_UNSPECIFIED;
}

}  // namespace

absl::Status CheckMayTrain(const Principal& who, const HeadEntry& head) {
  if (!head.owner.empty() || who.admin) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat(
      "head \"", head.head_id,
      "\" is a shared head: only an admin token may create its optimizer state, step it or "
      "checkpoint it"));
}

int64_t OptimizerStateBytes(const HeadSpec& spec, const OptimizerConfig& config) {
  const bool master = spec.dtype != DType::kF32;
  int64_t floats =
      spec.vocab_size * spec.hidden_size * StateArrayCount(config.kind, config.weight, master);
  if (spec.has_bias) floats += spec.vocab_size * StateArrayCount(config.kind, config.bias, master);
  return floats * 4;
}

absl::Status CreateHeadOptimizer(const ServiceContext& ctx, const Principal& who,
                                 const v1::CreateOptimizerRequest& request,
                                 v1::OptimizerInfo* out) {
  FLCE_RETURN_IF_ERROR(ValidateId(request.head_id(), "head_id"));
  FLCE_ASSIGN_OR_RETURN(HeadEntry head, ctx.heads->Get(who.tenant, request.head_id()));
  FLCE_RETURN_IF_ERROR(CheckMayTrain(who, head));
  const HeadSpec& spec = head.head->spec();
  OptimizerConfig config;
  FLCE_ASSIGN_OR_RETURN(config.kind, OptimizerKindFromProto(request.kind()));
  FLCE_ASSIGN_OR_RETURN(config.weight,
                        OptimizerGroupFromProto(config.kind, request.weight(), "weight"));
  config.bias = config.weight;
  if (request.has_bias()) {
    if (!spec.has_bias) {
      return absl::InvalidArgumentError(
          absl::StrCat("head \"", head.head_id, "\" has no bias: leave the bias group unset"));
    }
    FLCE_ASSIGN_OR_RETURN(config.bias,
                          OptimizerGroupFromProto(config.kind, request.bias(), "bias"));
  }
  FLCE_RETURN_IF_ERROR(ValidateOptimizerGroup(config.kind, config.weight, "weight"));
  if (spec.has_bias) FLCE_RETURN_IF_ERROR(ValidateOptimizerGroup(config.kind, config.bias, "bias"));

  HeadTrainingState& training = *head.training;
  absl::MutexLock lock(&training.mu());
  if (HeadOptimizer* existing = training.optimizer(); existing != nullptr) {
    if (!request.replace()) {
      return absl::AlreadyExistsError(absl::StrCat(
          "head \"", head.head_id, "\" already has ", OptimizerName(existing->config().kind),
          " state (", existing->steps(), " steps): set replace to start over"));
    }
    training.set_optimizer(nullptr);  // freed before the new state is allocated
  }
  FLCE_RETURN_IF_ERROR(ctx.heads->ReserveStateBytes(head.owner, head.head_id, &training,
                                                    OptimizerStateBytes(spec, config)));
  absl::StatusOr<std::unique_ptr<HeadOptimizer>> optimizer =
      ctx.engine->CreateOptimizer(head.head, config);
  if (!optimizer.ok()) {
    training.set_state_bytes(0);
    return optimizer.status();
  }
  training.set_optimizer(*std::move(optimizer));
  training.DescribeLocked(out);
  return absl::OkStatus();
}

absl::Status StepHead(const ServiceContext& ctx, const Principal& who,
                      const v1::StepRequest& request, absl::Time deadline,
                      const HeadGate::Alive& alive, v1::StepResponse* out) {
  const std::string session_id = SessionIdOrDefault(request.session_id());
  FLCE_RETURN_IF_ERROR(ValidateId(request.head_id(), "head_id"));
  FLCE_RETURN_IF_ERROR(ValidateId(session_id, "session_id"));
  FLCE_RETURN_IF_ERROR(ValidateRequestId(request.request_id(), "request_id"));
  if (request.request_id().empty()) {
    return absl::InvalidArgumentError(
        "request_id is empty: a Step needs one, so that a retry never applies it twice");
  }
  StepParams params;
  params.lr_weight = request.lr();
  params.lr_bias = request.has_bias_lr() ? request.bias_lr() : request.lr();
  FLCE_RETURN_IF_ERROR(ValidateLearningRate(params.lr_weight, "weight"));
  FLCE_RETURN_IF_ERROR(ValidateLearningRate(params.lr_bias, "bias"));
  const double clip = request.has_clip_coef() ? request.clip_coef() : 1.0;
  const double multiplier = request.has_grad_multiplier() ? request.grad_multiplier() : 1.0;
  FLCE_RETURN_IF_ERROR(CheckFactor("clip_coef", clip));
  FLCE_RETURN_IF_ERROR(CheckFactor("grad_multiplier", multiplier));
  params.grad_multiplier = static_cast<float>(clip * multiplier);

  FLCE_ASSIGN_OR_RETURN(HeadEntry head, ctx.heads->Get(who.tenant, request.head_id()));
  FLCE_RETURN_IF_ERROR(CheckMayTrain(who, head));
  HeadTrainingState& training = *head.training;
  absl::MutexLock lock(&training.mu());
  const uint64_t fingerprint = StepFingerprint(request);
  if (const HeadTrainingState::StepRecord* seen = training.FindStep(request.request_id())) {
    if (seen->fingerprint != fingerprint) {
      return absl::InvalidArgumentError(absl::StrCat(
          "request_id \"", request.request_id(),
          "\" was used for a Step with other values: choose a new request id for a new step"));
    }
    *out = seen->response;
    out->set_replayed(true);
    return absl::OkStatus();
  }
  HeadOptimizer* optimizer = training.optimizer();
  if (optimizer == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "head \"", head.head_id, "\" has no optimizer state: call CreateOptimizer first"));
  }
  // Steps on this head are serialised by the lock: the version read now is
  // the one this step replaces.
  FLCE_ASSIGN_OR_RETURN(HeadEntry now, ctx.heads->Get(who.tenant, request.head_id()));
  if (now.training.get() != &training) {
    return absl::AbortedError(absl::StrCat("head \"", head.head_id, "\" was replaced"));
  }
  if (request.has_expected_head_version() && request.expected_head_version() != now.version) {
    return absl::FailedPreconditionError(absl::StrCat(
        "head \"", head.head_id, "\" is at version ", now.version,
        "; the request expects expected_head_version = ", request.expected_head_version(),
        " (every applied Step bumps the version)"));
  }
  // Refused before waiting for the head: this session's own calls must be done.
  // A session that does not exist holds no gradient, as one without contributions.
  const absl::Status settled = ctx.sessions->CheckSettled(who.tenant, head.head_id, session_id);
  if (!settled.ok() && !absl::IsNotFound(settled)) return settled;
  const bool has_session = settled.ok();

  v1::StepOutcome outcome = v1::STEP_SKIPPED_NO_GRADIENT;
  uint64_t version = now.version;
  int64_t contributions = 0;
  if (has_session && request.found_inf()) {
    // As a GradScaler skip followed by zero_grad(): the gradient is dropped.
    outcome = v1::STEP_SKIPPED_FOUND_INF;
    FLCE_ASSIGN_OR_RETURN(
        contributions,
        ctx.sessions->ConsumeGrad(who.tenant, head.head_id, session_id,
                                  [](const GradBuffer&, int64_t) { return absl::OkStatus(); }));
  } else if (has_session) {
    FLCE_ASSIGN_OR_RETURN(HeadGate::Exclusive exclusive, training.gate().Lock(deadline, alive));
    FLCE_ASSIGN_OR_RETURN(
        contributions,
        ctx.sessions->ConsumeGrad(who.tenant, head.head_id, session_id,
                                  [&](const GradBuffer& grad, int64_t held) -> absl::Status {
                                    // No contribution is torch's grad None: the parameter is not
                                    // stepped (no weight decay, no moment update).
                                    if (held == 0) return absl::OkStatus();
                                    FLCE_ASSIGN_OR_RETURN(StepResult result,
                                                          optimizer->Step(grad, params));
                                    outcome = ToProto(result);
                                    return absl::OkStatus();
                                  }));
    if (outcome == v1::STEP_APPLIED) {
      FLCE_ASSIGN_OR_RETURN(version, ctx.heads->BumpVersion(head.owner, head.head_id, &training));
    }
  } else if (request.found_inf()) {
    outcome = v1::STEP_SKIPPED_FOUND_INF;
  }
  // A step without a gradient is no step (torch does not count it either).
  if (outcome != v1::STEP_APPLIED && outcome != v1::STEP_SKIPPED_NO_GRADIENT) {
    training.CountSkipped();
  }
  out->set_outcome(outcome);
  out->set_head_version(version);
  out->set_steps(optimizer->steps());
  out->set_contributions(contributions);
  if (ctx.metrics != nullptr) ctx.metrics->RecordStep(v1::StepOutcome_Name(outcome));
  training.RecordStep(request.request_id(), HeadTrainingState::StepRecord{fingerprint, *out});
  return absl::OkStatus();
}

absl::Status HeadGradNorm(const ServiceContext& ctx, const Principal& who,
                          const v1::GradNormRequest& request, v1::GradNormResponse* out) {
  const std::string session_id = SessionIdOrDefault(request.session_id());
  FLCE_RETURN_IF_ERROR(ValidateId(request.head_id(), "head_id"));
  FLCE_RETURN_IF_ERROR(ValidateId(session_id, "session_id"));
  FLCE_ASSIGN_OR_RETURN(HeadEntry head, ctx.heads->Get(who.tenant, request.head_id()));
  out->set_head_version(head.version);
  absl::StatusOr<NormSnapshot> norms = ctx.sessions->Norms(who.tenant, head.head_id, session_id);
  // A session that does not exist yet holds a zero gradient.
  if (absl::IsNotFound(norms.status())) return absl::OkStatus();
  FLCE_RETURN_IF_ERROR(norms.status());
  out->set_weight_sq_norm(norms->norms.weight_sq);
  out->set_bias_sq_norm(norms->norms.bias_sq);
  out->set_sq_norm(norms->norms.weight_sq + norms->norms.bias_sq);
  out->set_contributions(norms->contributions);
  out->mutable_computed_on()->set_oldest(norms->computed_on.oldest);
  out->mutable_computed_on()->set_newest(norms->computed_on.newest);
  return absl::OkStatus();
}

}  // namespace flce::server
