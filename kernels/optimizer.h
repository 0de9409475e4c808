// The optimizer a head is trained with where it lives: torch.optim's SGD and
// AdamW over the head's weight and bias (two parameter groups), with an fp32
// master copy for 16-bit heads. Engines implement HeadOptimizer; the math of
// one element is kernels/optimizer_math.h, shared by both engines.
//
// Usage:
//   OptimizerConfig config = DefaultOptimizerConfig(OptimizerKind::kAdamW);
//   FLCE_RETURN_IF_ERROR(ValidateOptimizerConfig(config));
//   auto optimizer = *engine->CreateOptimizer(head, config);
//   // ... compute calls accumulate grad into a session's GradBuffer ...
//   StepOutcome out = *optimizer->Step(grad, StepParams{.lr_weight = 1e-3, ...});
#ifndef FLCE_KERNELS_OPTIMIZER_H_
#define FLCE_KERNELS_OPTIMIZER_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/head_tensor.h"

namespace flce {

class GradBuffer;

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

// A head's optimizer state in the engine's memory: the fp32 master weight
// (16-bit heads; an fp32 head's weight is its own master), the moments, the
// step count. Step updates the head's resident weight in place, so the caller
// guarantees that no compute call uses the head while it runs.
class HeadOptimizer {
 public:
  virtual ~HeadOptimizer() = default;
  virtual const OptimizerConfig& config() const = 0;
  // Bytes of state besides the head itself (master, moments).
  virtual int64_t state_bytes() const = 0;
  // Steps applied so far (skipped steps are not counted, as in torch).
  virtual int64_t steps() const = 0;
  // One step with `grad` (the head's shape). Checks first, then updates: a
  // step that is not kApplied changes nothing.
  virtual absl::StatusOr<StepResult> Step(const GradBuffer& grad, const StepParams& params) = 0;
  // Elements [begin, begin + count) of a state tensor into host memory.
  // NOT_FOUND when this kind and group keep no such tensor (SGD without
  // momentum, AdamW without amsgrad); OUT_OF_RANGE outside the group.
  virtual absl::Status ReadState(HeadTensor group, OptimizerTensor tensor, int64_t begin,
                                 int64_t count, float* host_out) const = 0;
  // Restoring a checkpoint into fresh state: elements of a state tensor from
  // host memory (the master of a 16-bit head is then also rounded into the
  // served weight), and the step count. Errors as ReadState.
  virtual absl::Status WriteState(HeadTensor group, OptimizerTensor tensor, int64_t begin,
                                  int64_t count, const float* host) = 0;
  virtual void set_steps(int64_t steps) = 0;
};

}  // namespace flce

#endif  // FLCE_KERNELS_OPTIMIZER_H_
