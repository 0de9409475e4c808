// The optimizer a head is trained with where it lives, as every layer names
// it: torch.optim's SGD and AdamW (kinds, hyper-parameter groups with torch's
// defaults and validation), a step's parameters and outcome, and the state
// tensors an optimizer keeps. The engine's side is kernels/optimizer.h.
//
// Usage:
//   OptimizerConfig config{.kind = OptimizerKind::kAdamW};
//   config.weight = DefaultOptimizerGroup(config.kind);
//   FLCE_RETURN_IF_ERROR(ValidateOptimizerGroup(config.kind, config.weight, "weight"));
#ifndef FLCE_CORE_OPTIMIZER_CONFIG_H_
#define FLCE_CORE_OPTIMIZER_CONFIG_H_

#include <cstdint>

#include "absl/status/status.h"
#include "core/head_tensor.h"

namespace flce {

enum class OptimizerKind { kSgd, kAdamW };

const char* OptimizerName(OptimizerKind kind);  // "sgd", "adamw"

// One parameter group's hyper-parameters, torch.optim's names and meaning;
// the learning rate comes with each step (schedulers change it).
struct OptimizerGroup {
  double weight_decay = 0.0;
  // SGD
  double momentum = 0.0;
  double dampening = 0.0;
  bool nesterov = false;
  // AdamW
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  bool amsgrad = false;
};

struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::kAdamW;
  OptimizerGroup weight;
  OptimizerGroup bias;  // used only by heads with a bias
};

// torch's constructor defaults: SGD weight_decay 0, AdamW weight_decay 0.01.
OptimizerGroup DefaultOptimizerGroup(OptimizerKind kind);

// INVALID_ARGUMENT where torch.optim's constructor refuses the values (with
// its wording), and for values that are not finite. `group` names the group
// in the message ("weight", "bias").
absl::Status ValidateOptimizerGroup(OptimizerKind kind, const OptimizerGroup& group,
                                    const char* group_name);
absl::Status ValidateLearningRate(double lr, const char* group_name);

struct StepParams {
  double lr_weight = 0.0;
  double lr_bias = 0.0;
  // Every gradient element is multiplied by this before the update: the
  // clipping coefficient times the trainer's multiplier (1 / world size).
  float grad_multiplier = 1.0f;
};

enum class StepResult {
  kApplied,
  kNonFiniteGradient,  // grad x multiplier holds NaN or Inf: nothing changed
  kNonFiniteWeight,    // the update would make a weight (in the head's dtype) NaN or Inf
};

const char* StepResultName(StepResult result);  // "applied", "non_finite_gradient", ...

// The state tensors a HeadOptimizer keeps per parameter group.
enum class OptimizerTensor {
  kMaster,           // fp32 weight (a 16-bit head's master; an fp32 head's weight)
  kMomentum,         // SGD: momentum_buffer; AdamW: exp_avg
  kSecondMoment,     // AdamW: exp_avg_sq
  kMaxSecondMoment,  // AdamW with amsgrad: max_exp_avg_sq
};

// torch's state names ("momentum_buffer", "exp_avg", ...), and "master".
const char* OptimizerTensorName(OptimizerKind kind, OptimizerTensor tensor);

// OUT_OF_RANGE naming `what` unless [begin, begin + count) lies in [0, size).
absl::Status CheckElementRange(const char* what, int64_t begin, int64_t count, int64_t size);

// Which state arrays a kind keeps: SGD a momentum buffer when momentum != 0;
// AdamW exp_avg and exp_avg_sq, and max_exp_avg_sq with amsgrad.
struct StateArrays {
  bool m = false;
  bool v = false;
  bool vmax = false;
};

inline StateArrays StateArraysFor(OptimizerKind kind, const OptimizerGroup& group) {
  if (kind == OptimizerKind::kSgd) return StateArrays{group.momentum != 0.0, false, false};
  return StateArrays{true, true, group.amsgrad};
}

// fp32 arrays a group's state holds, each the group's size: the moments, and
// the master where the head's weight is 16-bit (keeps_master).
inline int64_t StateArrayCount(OptimizerKind kind, const OptimizerGroup& group, bool keeps_master) {
  const StateArrays a = StateArraysFor(kind, group);
  return (keeps_master ? 1 : 0) + (a.m ? 1 : 0) + (a.v ? 1 : 0) + (a.vmax ? 1 : 0);
}

// NOT_FOUND naming the state tensor a kind and group do not keep (ReadState,
// WriteState of every engine).
absl::Status MissingStateTensor(OptimizerKind kind, HeadTensor group, OptimizerTensor tensor);

}  // namespace flce

#endif  // FLCE_CORE_OPTIMIZER_CONFIG_H_
