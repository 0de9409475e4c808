#include "kernels/optimizer_math.h"

#include <cmath>


namespace flce {

ElementStep MakeElementStep(OptimizerKind kind, const OptimizerGroup& group, double lr,
                            float grad_multiplier, int64_t steps_before, DType weight_dtype) {
  ElementStep s;
  s.grad_multiplier = grad_multiplier;
  s.finite_limit = FiniteLimit(weight_dtype);
  if (kind == OptimizerKind::kSgd) {
    s.neg_lr = static_cast<float>(-lr);
    s.weight_decay = static_cast<float>(group.weight_decay);
    s.momentum = static_cast<float>(group.momentum);
    s.one_minus_dampening = static_cast<float>(1.0 - group.dampening);
    s.use_momentum = group.momentum != 0.0;
    s.nesterov = group.nesterov;
    s.first_step = steps_before == 0;
    return s;
  }
  const double step = static_cast<double>(steps_before + 1);
  s.decay = static_cast<float>(1.0 - lr * group.weight_decay);
  s.beta1 = static_cast<float>(group.beta1);
  s.one_minus_beta1 = static_cast<float>(1.0 - group.beta1);
  s.beta2 = static_cast<float>(group.beta2);
  s.one_minus_beta2 = static_cast<float>(1.0 - group.beta2);
  s.bias_correction2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(group.beta2, step)));
  s.eps = static_cast<float>(group.eps);
  s.neg_step_size = static_cast<float>(-(lr / (1.0 - std::pow(group.beta1, step))));
  s.amsgrad = group.amsgrad;
  return s;
}

}  // namespace flce
