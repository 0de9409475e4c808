// The optimizer a head is trained with where it lives, as engines keep it:
// torch.optim's SGD and AdamW over the head's weight and bias (two parameter
// groups), with an fp32 master copy for 16-bit heads. Engines implement
// HeadOptimizer; the math of one element is kernels/optimizer_math.h, shared
// by both engines; kinds, groups and their validation are core/optimizer_config.h.
//
// Usage:
//   OptimizerConfig config{.kind = OptimizerKind::kAdamW};
//   config.weight = config.bias = DefaultOptimizerGroup(config.kind);
//   auto optimizer = *engine->CreateOptimizer(head, config);
//   // ... compute calls accumulate grad into a session's GradBuffer ...
//   StepResult result = *optimizer->Step(grad, StepParams{.lr_weight = 1e-3, .lr_bias = 1e-3});
#ifndef FLCE_KERNELS_OPTIMIZER_H_
#define FLCE_KERNELS_OPTIMIZER_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/head_tensor.h"
#include "core/optimizer_config.h"

namespace flce {

class GradBuffer;

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
