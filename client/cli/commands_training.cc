// create-optimizer, step, grad-norm, save-checkpoint, load-checkpoint: the head
// trained where it lives, from the command line.
#include "client/cli/command.h"
#include "client/cli/json_views.h"
#include "core/status_macros.h"

namespace flce::cli {
namespace {

// The flags given for a group; unset optional fields stay unset (server defaults).
v1::OptimizerGroup GroupFromFlags(const FlagSet& flags, const std::string& weight_decay_flag) {
  v1::OptimizerGroup g;
  if (flags.has(weight_decay_flag)) g.set_weight_decay(flags.f64(weight_decay_flag));
  g.set_momentum(flags.f64("momentum"));
  g.set_dampening(flags.f64("dampening"));
  g.set_nesterov(flags.flag("nesterov"));
  if (flags.has("beta1")) g.set_beta1(flags.f64("beta1"));
  if (flags.has("beta2")) g.set_beta2(flags.f64("beta2"));
  if (flags.has("eps")) g.set_eps(flags.f64("eps"));
  g.set_amsgrad(flags.flag("amsgrad"));
  return g;
}

}  // namespace

void DeclareCreateOptimizer(FlagSet& flags) {
  flags.String("head", "head id").Required();
  flags.Choice("kind", {"sgd", "adamw"}, "", "torch.optim.SGD or torch.optim.AdamW").Required();
  flags.Double("weight-decay", "the weight's (default: SGD 0, AdamW 0.01)");
  flags.Double("bias-weight-decay", "the bias group's (default: the weight's)");
  flags.Double("momentum", "SGD", "0");
  flags.Double("dampening", "SGD", "0");
  flags.Bool("nesterov", "SGD");
  flags.Double("beta1", "AdamW (default 0.9)");
  flags.Double("beta2", "AdamW (default 0.999)");
  flags.Double("eps", "AdamW (default 1e-8)");
  flags.Bool("amsgrad", "AdamW");
  flags.Bool("replace", "drop existing optimizer state (else ALREADY_EXISTS)");
}

absl::StatusOr<CommandResult> RunCreateOptimizer(const FlagSet& flags, CliEnv& env) {
  v1::CreateOptimizerRequest request;
  request.set_head_id(flags.str("head"));
  request.set_kind(flags.str("kind") == "sgd" ? v1::OPTIMIZER_SGD : v1::OPTIMIZER_ADAMW);
  *request.mutable_weight() = GroupFromFlags(flags, "weight-decay");
  if (flags.has("bias-weight-decay")) {
    *request.mutable_bias() = GroupFromFlags(flags, "bias-weight-decay");
  }
  request.set_replace(flags.flag("replace"));
  FLCE_ASSIGN_OR_RETURN(Client * client, env.client());
  FLCE_ASSIGN_OR_RETURN(v1::OptimizerInfo info, client->CreateOptimizer(request));
  return CommandResult{OptimizerInfoJson(info)};
}

void DeclareStep(FlagSet& flags) {
  flags.String("head", "head id").Required();
  flags.String("session", "whose gradient is applied").Required();
  flags.Double("lr", "the weight group's learning rate").Required();
  flags.Double("bias-lr", "the bias group's (default: --lr)");
  flags.Double("clip-coef", "multiplies the gradient (clip_grad_norm_'s coefficient)");
  flags.Double("grad-multiplier", "multiplies the gradient, e.g. 1/world_size");
  flags.Bool("found-inf", "the trainer's own gradients overflowed: skip the step");
  flags.Int("expected-version", "refuse unless the head is at this version");
  flags.String("request-id", "idempotency key; default: a fresh random one");
}

absl::StatusOr<CommandResult> RunStep(const FlagSet& flags, CliEnv& env) {
  v1::StepRequest request;
  request.set_head_id(flags.str("head"));
  request.set_session_id(flags.str("session"));
  request.set_request_id(flags.str("request-id"));
  request.set_lr(flags.f64("lr"));
  if (flags.has("bias-lr")) request.set_bias_lr(flags.f64("bias-lr"));
  if (flags.has("clip-coef")) request.set_clip_coef(flags.f64("clip-coef"));
  if (flags.has("grad-multiplier")) request.set_grad_multiplier(flags.f64("grad-multiplier"));
  request.set_found_inf(flags.flag("found-inf"));
  if (flags.has("expected-version")) {
    request.set_expected_head_version(static_cast<uint64_t>(flags.i64("expected-version")));
  }
  FLCE_ASSIGN_OR_RETURN(Client * client, env.client());
  FLCE_ASSIGN_OR_RETURN(v1::StepResponse step, client->Step(request));
  return CommandResult{
      {{"outcome", WithoutPrefix(v1::StepOutcome_Name(step.outcome()), "STEP_")},
       {"head_version", step.head_version()},
       {"steps", step.steps()},
       {"contributions", step.contributions()},
       {"replayed", step.replayed()}}};
}

void DeclareGradNorm(FlagSet& flags) {
  flags.String("head", "head id").Required();
  flags.String("session", "session id").Required();
}

absl::StatusOr<CommandResult> RunGradNorm(const FlagSet& flags, CliEnv& env) {
  FLCE_ASSIGN_OR_RETURN(Client * client, env.client());
  FLCE_ASSIGN_OR_RETURN(v1::GradNormResponse norm,
                        client->GradNorm(flags.str("head"), flags.str("session")));
  return CommandResult{{{"sq_norm", norm.sq_norm()},
                        {"weight_sq_norm", norm.weight_sq_norm()},
                        {"bias_sq_norm", norm.bias_sq_norm()},
                        {"contributions", norm.contributions()},
                        {"head_version", norm.head_version()},
                        {"computed_on",
                         {{"oldest", norm.computed_on().oldest()},
                          {"newest", norm.computed_on().newest()}}}}};
}

void DeclareSaveCheckpoint(FlagSet& flags) {
  flags.String("head", "head id").Required();
  flags.String("name", "checkpoint name: the file <name>.safetensors under --checkpoint-dir")
      .Required();
  flags.Bool("overwrite", "replace a checkpoint of that name (else ALREADY_EXISTS)");
  flags.String("request-id", "idempotency key; default: a fresh random one");
}

absl::StatusOr<CommandResult> RunSaveCheckpoint(const FlagSet& flags, CliEnv& env) {
  v1::SaveCheckpointRequest request;
  request.set_head_id(flags.str("head"));
  request.set_name(flags.str("name"));
  request.set_overwrite(flags.flag("overwrite"));
  request.set_request_id(flags.str("request-id"));
  FLCE_ASSIGN_OR_RETURN(Client * client, env.client());
  FLCE_ASSIGN_OR_RETURN(v1::CheckpointInfo info, client->SaveCheckpoint(request));
  return CommandResult{{{"name", info.name()},
                        {"bytes", info.bytes()},
                        {"head_version", info.head_version()},
                        {"steps", info.steps()},
                        {"has_optimizer", info.has_optimizer()},
                        {"replayed", info.replayed()}}};
}

void DeclareLoadCheckpoint(FlagSet& flags) {
  flags.String("head", "head id").Required();
  flags.String("name", "checkpoint name").Required();
  flags.Bool("reset-optimizer", "load into a head that has optimizer state, dropping it");
  flags.String("request-id", "idempotency key; default: a fresh random one");
}

absl::StatusOr<CommandResult> RunLoadCheckpoint(const FlagSet& flags, CliEnv& env) {
  v1::LoadCheckpointRequest request;
  request.set_head_id(flags.str("head"));
  request.set_name(flags.str("name"));
  request.set_reset_optimizer(flags.flag("reset-optimizer"));
  request.set_request_id(flags.str("request-id"));
  FLCE_ASSIGN_OR_RETURN(Client * client, env.client());
  FLCE_ASSIGN_OR_RETURN(v1::HeadInfo head, client->LoadCheckpoint(request));
  return CommandResult{HeadInfoJson(head)};
}

}  // namespace flce::cli
