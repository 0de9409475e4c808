#include "kernels/cpu/cpu_optimizer.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "kernels/cpu/cpu_grad_buffer.h"
#include "kernels/optimizer_math.h"

namespace flce::cpu {
namespace {

template <OptimizerKind kKind>
unsigned CheckLoop(const ElementStep& s, const float* grad, const float* params, const float* m,
                   const float* v, const float* vmax, int64_t n) {
  unsigned found = kElementOk;
  for (int64_t i = 0; i < n; ++i) {
    ElementState e{params[i], m ? m[i] : 0.0f, v ? v[i] : 0.0f, vmax ? vmax[i] : 0.0f};
    found |= StepElement<kKind>(s, grad[i], e);
  }
  return found;
}

template <OptimizerKind kKind>
void ApplyLoop(const ElementStep& s, const float* grad, float* params, float* m, float* v,
               float* vmax, float* served, DType dtype, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    ElementState e{params[i], m ? m[i] : 0.0f, v ? v[i] : 0.0f, vmax ? vmax[i] : 0.0f};
    StepElement<kKind>(s, grad[i], e);
    params[i] = e.param;
    if (m) m[i] = e.m;
    if (v) v[i] = e.v;
    if (vmax) vmax[i] = e.vmax;
  }
  // Compute calls read the master rounded to the head's dtype, widened.
  if (served != params) {
    for (int64_t i = 0; i < n; ++i) served[i] = params[i];
    RoundTo(dtype, served, n);
  }
}

float* OrNull(std::vector<float>& values) { return values.empty() ? nullptr : values.data(); }

}  // namespace

absl::StatusOr<std::unique_ptr<CpuHeadOptimizer>> CpuHeadOptimizer::Create(
    std::shared_ptr<const CpuHead> head, const OptimizerConfig& config) {
  FLCE_RETURN_IF_ERROR(ValidateOptimizerGroup(config.kind, config.weight, "weight"));
  if (head->spec().has_bias) {
    FLCE_RETURN_IF_ERROR(ValidateOptimizerGroup(config.kind, config.bias, "bias"));
  }
  return std::unique_ptr<CpuHeadOptimizer>(new CpuHeadOptimizer(std::move(head), config));
}

CpuHeadOptimizer::CpuHeadOptimizer(std::shared_ptr<const CpuHead> head,
                                   const OptimizerConfig& config)
    : head_(std::move(head)), config_(config), dtype_(head_->spec().dtype) {
  const HeadSpec& spec = head_->spec();
  InitGroup(weight_, config_.weight, head_->weight_for_update(),
            spec.vocab_size * spec.hidden_size);
  if (spec.has_bias) InitGroup(bias_, config_.bias, head_->bias_for_update(), spec.vocab_size);
}

void CpuHeadOptimizer::InitGroup(Group& group, const OptimizerGroup& hyper, float* served,
                                 int64_t size) {
  group.hyper = &hyper;
  group.served = served;
  group.size = size;
  // The served values of a 16-bit head are exactly its 16-bit weight, so the
  // master starts as that weight widened.
  if (dtype_ != DType::kF32) group.master.assign(served, served + size);
  StateArrays arrays = StateArraysFor(config_.kind, hyper);
  if (arrays.m) group.m.assign(size, 0.0f);
  if (arrays.v) group.v.assign(size, 0.0f);
  if (arrays.vmax) group.vmax.assign(size, 0.0f);
}

int64_t CpuHeadOptimizer::state_bytes() const {
  int64_t floats = 0;
  for (const Group* g : {&weight_, &bias_}) {
    floats += static_cast<int64_t>(g->master.size() + g->m.size() + g->v.size() + g->vmax.size());
  }
  return floats * static_cast<int64_t>(sizeof(float));
}

unsigned CpuHeadOptimizer::CheckGroup(Group& group, const float* grad, double lr,
                                      float multiplier) const {
  if (group.size == 0) return kElementOk;
  ElementStep s = MakeElementStep(config_.kind, *group.hyper, lr, multiplier, steps_, dtype_);
  auto loop = config_.kind == OptimizerKind::kSgd ? CheckLoop<OptimizerKind::kSgd>
                                                  : CheckLoop<OptimizerKind::kAdamW>;
  return loop(s, grad, group.params(), OrNull(group.m), OrNull(group.v), OrNull(group.vmax),
              group.size);
}

void CpuHeadOptimizer::ApplyGroup(Group& group, const float* grad, double lr, float multiplier) {
  if (group.size == 0) return;
  ElementStep s = MakeElementStep(config_.kind, *group.hyper, lr, multiplier, steps_, dtype_);
  auto loop = config_.kind == OptimizerKind::kSgd ? ApplyLoop<OptimizerKind::kSgd>
                                                  : ApplyLoop<OptimizerKind::kAdamW>;
  loop(s, grad, group.params(), OrNull(group.m), OrNull(group.v), OrNull(group.vmax), group.served,
       dtype_, group.size);
}

absl::StatusOr<StepResult> CpuHeadOptimizer::Step(const GradBuffer& grad,
                                                  const StepParams& params) {
  const auto* cpu_grad = dynamic_cast<const CpuGradBuffer*>(&grad);
  const HeadSpec& spec = head_->spec();
  if (cpu_grad == nullptr || grad.vocab_size() != spec.vocab_size ||
      grad.hidden_size() != spec.hidden_size || grad.has_bias() != spec.has_bias) {
    return absl::InvalidArgumentError("Step: the gradient is not a CPU buffer of the head's shape");
  }
  FLCE_RETURN_IF_ERROR(ValidateLearningRate(params.lr_weight, "weight"));
  if (spec.has_bias) FLCE_RETURN_IF_ERROR(ValidateLearningRate(params.lr_bias, "bias"));
  unsigned found =
      CheckGroup(weight_, cpu_grad->weight(), params.lr_weight, params.grad_multiplier);
  found |= CheckGroup(bias_, cpu_grad->bias(), params.lr_bias, params.grad_multiplier);
  if (found & kElementBadGradient) return StepResult::kNonFiniteGradient;
  if (found & kElementBadWeight) return StepResult::kNonFiniteWeight;
  ApplyGroup(weight_, cpu_grad->weight(), params.lr_weight, params.grad_multiplier);
  ApplyGroup(bias_, cpu_grad->bias(), params.lr_bias, params.grad_multiplier);
  ++steps_;
  return StepResult::kApplied;
}

absl::StatusOr<float*> CpuHeadOptimizer::StateArray(HeadTensor group_id,
                                                    OptimizerTensor tensor) const {
  Group& group = const_cast<Group&>(group_id == HeadTensor::kWeight ? weight_ : bias_);
  float* values = nullptr;
  switch (tensor) {
    case OptimizerTensor::kMaster:
      values = group.size > 0 ? group.params() : nullptr;
      break;
    case OptimizerTensor::kMomentum:
      values = OrNull(group.m);
      break;
    case OptimizerTensor::kSecondMoment:
      values = OrNull(group.v);
      break;
    case OptimizerTensor::kMaxSecondMoment:
      values = OrNull(group.vmax);
      break;
  }
  if (values == nullptr) {
    return MissingStateTensor(config_.kind, group_id, tensor);
  }
  return values;
}

absl::Status CpuHeadOptimizer::ReadState(HeadTensor group_id, OptimizerTensor tensor, int64_t begin,
                                         int64_t count, float* host_out) const {
  FLCE_ASSIGN_OR_RETURN(const float* values, StateArray(group_id, tensor));
  const Group& group = group_id == HeadTensor::kWeight ? weight_ : bias_;
  FLCE_RETURN_IF_ERROR(CheckElementRange(HeadTensorName(group_id), begin, count, group.size));
  std::copy(values + begin, values + begin + count, host_out);
  return absl::OkStatus();
}

absl::Status CpuHeadOptimizer::WriteState(HeadTensor group_id, OptimizerTensor tensor,
                                          int64_t begin, int64_t count, const float* host) {
  FLCE_ASSIGN_OR_RETURN(float* values, StateArray(group_id, tensor));
  Group& group = group_id == HeadTensor::kWeight ? weight_ : bias_;
  FLCE_RETURN_IF_ERROR(CheckElementRange(HeadTensorName(group_id), begin, count, group.size));
  std::copy(host, host + count, values + begin);
  if (tensor == OptimizerTensor::kMaster && values != group.served) {
    std::copy(host, host + count, group.served + begin);
    RoundTo(dtype_, group.served + begin, count);
  }
  return absl::OkStatus();
}

}  // namespace flce::cpu
