#include "core/optimizer_config.h"

#include <cmath>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace flce {
namespace {

absl::Status Invalid(const char* group_name, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(group_name, " group: ", what));
}

absl::Status CheckFinite(const char* group_name, const char* field, double value) {
  if (std::isfinite(value)) return absl::OkStatus();
  return Invalid(group_name, absl::StrCat(field, " = ", value, " is not finite"));
}

}  // namespace

const char* OptimizerName(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::kSgd:
      return "sgd";
    case OptimizerKind::kAdamW:
      return "adamw";
  }
  return "unknown";
}

const char* OptimizerTensorName(OptimizerKind kind, OptimizerTensor tensor) {
  switch (tensor) {
    case OptimizerTensor::kMaster:
      return "master";
    case OptimizerTensor::kMomentum:
      return kind == OptimizerKind::kSgd ? "momentum_buffer" : "exp_avg";
    case OptimizerTensor::kSecondMoment:
      return "exp_avg_sq";
    case OptimizerTensor::kMaxSecondMoment:
      return "max_exp_avg_sq";
  }
  return "unknown";
}

const char* StepResultName(StepResult result) {
  switch (result) {
    case StepResult::kApplied:
      return "applied";
    case StepResult::kNonFiniteGradient:
      return "non_finite_gradient";
    case StepResult::kNonFiniteWeight:
      return "non_finite_weight";
  }
  return "unknown";
}

OptimizerGroup DefaultOptimizerGroup(OptimizerKind kind) {
  OptimizerGroup group;
  if (kind == OptimizerKind::kAdamW) group.weight_decay = 1e-2;
  return group;
}

absl::Status ValidateLearningRate(double lr, const char* group_name) {
  if (!std::isfinite(lr)) return Invalid(group_name, absl::StrCat("lr = ", lr, " is not finite"));
  if (lr < 0.0) return Invalid(group_name, absl::StrCat("Invalid learning rate: ", lr));
  return absl::OkStatus();
}

absl::Status ValidateOptimizerGroup(OptimizerKind kind, const OptimizerGroup& g,
                                    const char* group_name) {
  for (auto [field, value] : {std::pair<const char*, double>{"weight_decay", g.weight_decay},
                              {"momentum", g.momentum},
                              {"dampening", g.dampening},
                              {"beta1", g.beta1},
                              {"beta2", g.beta2},
                              {"eps", g.eps}}) {
    absl::Status finite = CheckFinite(group_name, field, value);
    if (!finite.ok()) return finite;
  }
  // torch.optim's constructors, in their order and words.
  if (kind == OptimizerKind::kSgd) {
    if (g.momentum < 0.0) {
      return Invalid(group_name, absl::StrCat("Invalid momentum value: ", g.momentum));
    }
    if (g.weight_decay < 0.0) {
      return Invalid(group_name, absl::StrCat("Invalid weight_decay value: ", g.weight_decay));
    }
    if (g.nesterov && (g.momentum <= 0.0 || g.dampening != 0.0)) {
      return Invalid(group_name, "Nesterov momentum requires a momentum and zero dampening");
    }
    return absl::OkStatus();
  }
  if (g.eps < 0.0) return Invalid(group_name, absl::StrCat("Invalid epsilon value: ", g.eps));
  if (!(g.beta1 >= 0.0 && g.beta1 < 1.0)) {
    return Invalid(group_name, absl::StrCat("Invalid beta parameter at index 0: ", g.beta1));
  }
  if (!(g.beta2 >= 0.0 && g.beta2 < 1.0)) {
    return Invalid(group_name, absl::StrCat("Invalid beta parameter at index 1: ", g.beta2));
  }
  if (g.weight_decay < 0.0) {
    return Invalid(group_name, absl::StrCat("Invalid weight_decay value: ", g.weight_decay));
  }
  return absl::OkStatus();
}

absl::Status CheckElementRange(const char* what, int64_t begin, int64_t count, int64_t size) {
  if (begin < 0 || count < 0 || begin > size || count > size - begin) {
    return absl::OutOfRangeError(
        absl::StrCat(what, " elements [", begin, ", ", begin + count, ") outside [0, ", size, ")"));
  }
  return absl::OkStatus();
}

absl::Status MissingStateTensor(OptimizerKind kind, HeadTensor group, OptimizerTensor tensor) {
  return absl::NotFoundError(absl::StrCat("the ", OptimizerName(kind), " state of the ",
                                          HeadTensorName(group), " has no ",
                                          OptimizerTensorName(kind, tensor)));
}

}  // namespace flce
