#include "kernels/cuda/engine/cuda_optimizer.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "kernels/cuda/ops/elementwise_kernels.cuh"

namespace flce::cuda {
namespace {

float* Floats(const DeviceBuffer& buffer) { return static_cast<float*>(buffer.get()); }

}  // namespace

absl::StatusOr<std::unique_ptr<CudaHeadOptimizer>> CudaHeadOptimizer::Create(
    std::shared_ptr<const CudaHead> head, const OptimizerConfig& config) {
  FLCE_RETURN_IF_ERROR(ValidateOptimizerGroup(config.kind, config.weight, "weight"));
  const HeadSpec& spec = head->spec();
  if (spec.has_bias) {
    FLCE_RETURN_IF_ERROR(ValidateOptimizerGroup(config.kind, config.bias, "bias"));
  }
  std::unique_ptr<CudaHeadOptimizer> optimizer(new CudaHeadOptimizer(std::move(head), config));
  FLCE_RETURN_IF_ERROR(optimizer->ctx_->Enter());
  FLCE_RETURN_IF_ERROR(optimizer->InitGroup(optimizer->weight_, optimizer->config_.weight,
                                            optimizer->head_->weight_for_update(),
                                            spec.vocab_size * spec.hidden_size));
  if (spec.has_bias) {
    FLCE_RETURN_IF_ERROR(optimizer->InitGroup(optimizer->bias_, optimizer->config_.bias,
                                              optimizer->head_->bias_for_update(),
                                              spec.vocab_size));
  }
  return optimizer;
}

CudaHeadOptimizer::CudaHeadOptimizer(std::shared_ptr<const CudaHead> head,
                                     const OptimizerConfig& config)
    : head_(std::move(head)),
      ctx_(head_->context()),
      config_(config),
      dtype_(head_->spec().dtype) {}

absl::Status CudaHeadOptimizer::InitGroup(Group& group, const OptimizerGroup& hyper, void* served,
                                          int64_t count) {
  group.hyper = &hyper;
  group.served = served;
  group.count = count;
  const int64_t bytes = count * static_cast<int64_t>(sizeof(float));
  DeviceHealth* health = ctx_->health();
  StateArrays arrays = StateArraysFor(config_.kind, hyper);
  for (auto [wanted, buffer] :
       {std::pair<bool, DeviceBuffer*>{dtype_ != DType::kF32, &group.master},
        {arrays.m, &group.m},
        {arrays.v, &group.v},
        {arrays.vmax, &group.vmax}}) {
    if (!wanted) continue;
    FLCE_ASSIGN_OR_RETURN(*buffer, DeviceBuffer::Allocate(bytes, health));
    if (buffer != &group.master) FLCE_RETURN_IF_ERROR(ctx_->Memset(buffer->get(), 0, bytes));
  }
  if (group.master.get() == nullptr) return absl::OkStatus();
  // The master starts as the served 16-bit weight, widened (exactly).
  absl::StatusOr<unsigned> done = ctx_->RunFlagged([&](cudaStream_t stream, unsigned*) {
    return LaunchConvert(dtype_, served, DType::kF32, group.master.get(), count, stream, health);
  });
  return done.status();
}

int64_t CudaHeadOptimizer::state_bytes() const {
  int64_t bytes = 0;
  for (const Group* g : {&weight_, &bias_}) {
    bytes += g->master.bytes() + g->m.bytes() + g->v.bytes() + g->vmax.bytes();
  }
  return bytes;
}

OptimizerArrays CudaHeadOptimizer::Arrays(const Group& group, const float* grad) const {
  OptimizerArrays a;
  a.grad = grad;
  const bool own_master = group.master.get() != nullptr;
  a.params = own_master ? Floats(group.master) : static_cast<float*>(group.served);
  a.m = Floats(group.m);
  a.v = Floats(group.v);
  a.vmax = Floats(group.vmax);
  a.served = own_master ? group.served : nullptr;
  a.served_dtype = dtype_;
  a.count = group.count;
  return a;
}

absl::StatusOr<StepResult> CudaHeadOptimizer::Step(const GradBuffer& grad,
                                                   const StepParams& params) {
  FLCE_ASSIGN_OR_RETURN(const StepResult checked, CheckStep(grad, params));
  if (checked != StepResult::kApplied) return checked;
  FLCE_RETURN_IF_ERROR(ApplyStep(grad, params));
  return StepResult::kApplied;
}

absl::StatusOr<CudaHeadOptimizer::StepArrays> CudaHeadOptimizer::Prepare(
    const GradBuffer& grad, const StepParams& params) const {
  const auto* cuda_grad = dynamic_cast<const CudaGradBuffer*>(&grad);
  const HeadSpec& spec = head_->spec();
  if (cuda_grad == nullptr || cuda_grad->context() != ctx_.get() ||
      grad.vocab_size() != spec.vocab_size || grad.hidden_size() != spec.hidden_size ||
      grad.has_bias() != spec.has_bias) {
    return absl::InvalidArgumentError(
        "Step: the gradient is not a buffer of this CUDA engine with the head's shape");
  }
  FLCE_RETURN_IF_ERROR(ValidateLearningRate(params.lr_weight, "weight"));
  if (spec.has_bias) FLCE_RETURN_IF_ERROR(ValidateLearningRate(params.lr_bias, "bias"));
  StepArrays out;
  out.w = MakeElementStep(config_.kind, config_.weight, params.lr_weight, params.grad_multiplier,
                          steps_, dtype_);
  out.b = MakeElementStep(config_.kind, config_.bias, params.lr_bias, params.grad_multiplier,
                          steps_, dtype_);
  out.wa = Arrays(weight_, cuda_grad->weight());
  out.ba = Arrays(bias_, cuda_grad->bias());
  return out;
}

absl::StatusOr<StepResult> CudaHeadOptimizer::CheckStep(const GradBuffer& grad,
                                                        const StepParams& params) const {
  FLCE_ASSIGN_OR_RETURN(const StepArrays a, Prepare(grad, params));
  DeviceHealth* health = ctx_->health();
  FLCE_ASSIGN_OR_RETURN(unsigned found, ctx_->RunFlagged([&](cudaStream_t stream, unsigned* flags) {
    FLCE_RETURN_IF_ERROR(LaunchOptimizerCheck(config_.kind, a.w, a.wa, flags, stream, health));
    return LaunchOptimizerCheck(config_.kind, a.b, a.ba, flags, stream, health);
  }));
  if (found & kElementBadGradient) return StepResult::kNonFiniteGradient;
  if (found & kElementBadWeight) return StepResult::kNonFiniteWeight;
  return StepResult::kApplied;
}

absl::Status CudaHeadOptimizer::ApplyStep(const GradBuffer& grad, const StepParams& params) {
  FLCE_ASSIGN_OR_RETURN(const StepArrays a, Prepare(grad, params));
  DeviceHealth* health = ctx_->health();
  absl::StatusOr<unsigned> applied = ctx_->RunFlagged([&](cudaStream_t stream, unsigned*) {
    FLCE_RETURN_IF_ERROR(LaunchOptimizerApply(config_.kind, a.w, a.wa, stream, health));
    return LaunchOptimizerApply(config_.kind, a.b, a.ba, stream, health);
  });
  FLCE_RETURN_IF_ERROR(applied.status());
  ++steps_;
  return absl::OkStatus();
}

absl::StatusOr<float*> CudaHeadOptimizer::StateArray(HeadTensor group_id,
                                                     OptimizerTensor tensor) const {
  const Group& group = group_id == HeadTensor::kWeight ? weight_ : bias_;
  const OptimizerArrays a = Arrays(group, nullptr);
  float* values = nullptr;
  switch (tensor) {
    case OptimizerTensor::kMaster:
      values = group.count > 0 ? a.params : nullptr;
      break;
    case OptimizerTensor::kMomentum:
      values = a.m;
      break;
    case OptimizerTensor::kSecondMoment:
      values = a.v;
      break;
    case OptimizerTensor::kMaxSecondMoment:
      values = a.vmax;
      break;
  }
  if (values == nullptr) {
    return MissingStateTensor(config_.kind, group_id, tensor);
  }
  return values;
}

absl::Status CudaHeadOptimizer::ReadState(HeadTensor group_id, OptimizerTensor tensor,
                                          int64_t begin, int64_t count, float* host_out) const {
  FLCE_ASSIGN_OR_RETURN(const float* values, StateArray(group_id, tensor));
  const Group& group = group_id == HeadTensor::kWeight ? weight_ : bias_;
  FLCE_RETURN_IF_ERROR(CheckElementRange(HeadTensorName(group_id), begin, count, group.count));
  return ctx_->CopyToHost(host_out, values + begin, count * static_cast<int64_t>(sizeof(float)));
}

absl::Status CudaHeadOptimizer::WriteState(HeadTensor group_id, OptimizerTensor tensor,
                                           int64_t begin, int64_t count, const float* host) {
  FLCE_ASSIGN_OR_RETURN(float* values, StateArray(group_id, tensor));
  const Group& group = group_id == HeadTensor::kWeight ? weight_ : bias_;
  FLCE_RETURN_IF_ERROR(CheckElementRange(HeadTensorName(group_id), begin, count, group.count));
  FLCE_RETURN_IF_ERROR(
      ctx_->CopyToDevice(values + begin, host, count * static_cast<int64_t>(sizeof(float))));
  if (tensor != OptimizerTensor::kMaster || group.master.get() == nullptr) {
    return absl::OkStatus();
  }
  // The served 16-bit weight follows its master.
  char* served = static_cast<char*>(group.served) + begin * DTypeSize(dtype_);
  DeviceHealth* health = ctx_->health();
  return ctx_
      ->RunFlagged([&](cudaStream_t stream, unsigned*) {
        return LaunchConvert(DType::kF32, values + begin, dtype_, served, count, stream, health);
      })
      .status();
}

}  // namespace flce::cuda
