// One element of one optimizer step, the same source for the CPU loop and the
// CUDA kernel. The order of operations and the fp32 rounding of every scalar
// follow torch.optim's single-tensor SGD and AdamW, so a server step and
// torch's step on the same gradient agree to fp32 rounding.
#ifndef FLCE_KERNELS_OPTIMIZER_MATH_H_
#define FLCE_KERNELS_OPTIMIZER_MATH_H_

#include <cmath>
#include <cstdint>

#include "core/dtype.h"
#include "core/host_device.h"
#include "core/optimizer_config.h"

namespace flce {

// A group's step as fp32 scalars, computed on the host in double the way torch
// computes them in Python, then rounded to fp32 as torch does when it applies
// a Python float to an fp32 tensor.
struct ElementStep {
  float grad_multiplier = 1.0f;
  // SGD
  float neg_lr = 0.0f;
  float weight_decay = 0.0f;
  float momentum = 0.0f;
  float one_minus_dampening = 1.0f;
  bool use_momentum = false;
  bool nesterov = false;
  bool first_step = true;  // torch's momentum buffer is None: buf = grad
  // AdamW
  float decay = 1.0f;  // 1 - lr * weight_decay
  float beta1 = 0.9f;
  float one_minus_beta1 = 0.1f;
  float beta2 = 0.999f;
  float one_minus_beta2 = 0.001f;
  float bias_correction2_sqrt = 1.0f;
  float eps = 1e-8f;
  float neg_step_size = 0.0f;  // -lr / (1 - beta1^step)
  bool amsgrad = false;
  // Largest magnitude that rounds to a finite value in the head's dtype.
  float finite_limit = 0.0f;
};

// steps_before: steps applied so far (the one being computed is steps_before + 1).
ElementStep MakeElementStep(OptimizerKind kind, const OptimizerGroup& group, double lr,
                            float grad_multiplier, int64_t steps_before, DType weight_dtype);

// |x| below this rounds to a finite value of `dtype` (round to nearest even).
FLCE_HOST_DEVICE float FiniteLimit(DType dtype) {
  switch (dtype) {
    case DType::kF16:
      return 65520.0f;  // halfway to 2^16 rounds to even: Inf
    case DType::kBF16:
      return 3.3961776e38f;  // bits 0x7F7F8000, halfway past bf16's max
    case DType::kF32:
      break;
  }
  return INFINITY;
}

// What a step of one element found; the outputs are unspecified unless kOk.
enum ElementCheck : unsigned {
  kElementOk = 0,
  kElementBadGradient = 1,  // grad x multiplier is NaN or Inf
  kElementBadWeight = 2,    // the new weight is not finite in the head's dtype
};

// One parameter element and its optimizer state, updated in place.
struct ElementState {
  float param;
  float m;     // SGD: the momentum buffer; AdamW: exp_avg
  float v;     // AdamW: exp_avg_sq
  float vmax;  // AdamW with amsgrad: max_exp_avg_sq
};

FLCE_HOST_DEVICE unsigned SgdElement(const ElementStep& s, float grad, ElementState& e) {
  float g = grad * s.grad_multiplier;
  if (!(fabsf(g) <= 3.4028235e38f)) return kElementBadGradient;
  if (s.weight_decay != 0.0f) g = g + s.weight_decay * e.param;
  if (s.use_momentum) {
    e.m = s.first_step ? g : e.m * s.momentum + s.one_minus_dampening * g;
    g = s.nesterov ? g + s.momentum * e.m : e.m;
  }
  e.param = e.param + s.neg_lr * g;
  return fabsf(e.param) < s.finite_limit ? kElementOk : kElementBadWeight;
}

FLCE_HOST_DEVICE unsigned AdamWElement(const ElementStep& s, float grad, ElementState& e) {
  float g = grad * s.grad_multiplier;
  if (!(fabsf(g) <= 3.4028235e38f)) return kElementBadGradient;
  e.param = e.param * s.decay;
  e.m = e.m * s.beta1 + s.one_minus_beta1 * g;
  e.v = e.v * s.beta2 + s.one_minus_beta2 * g * g;
  float second = e.v;
  if (s.amsgrad) {
    e.vmax = fmaxf(e.vmax, e.v);
    second = e.vmax;
  }
  float denom = sqrtf(second) / s.bias_correction2_sqrt + s.eps;
  e.param = e.param + s.neg_step_size * e.m / denom;
  return fabsf(e.param) < s.finite_limit ? kElementOk : kElementBadWeight;
}

template <OptimizerKind kKind>
FLCE_HOST_DEVICE unsigned StepElement(const ElementStep& s, float grad, ElementState& e) {
  if constexpr (kKind == OptimizerKind::kSgd) {
    return SgdElement(s, grad, e);
  } else {
    return AdamWElement(s, grad, e);
  }
}

}  // namespace flce

#endif  // FLCE_KERNELS_OPTIMIZER_MATH_H_
