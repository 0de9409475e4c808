#include "server/state/head_training_state.h"

#include <utility>

#include "flce/v1/convert.h"

namespace flce::server {

void HeadTrainingState::set_optimizer(std::unique_ptr<HeadOptimizer> optimizer) {
  optimizer_ = std::move(optimizer);
  skipped_ = 0;
  steps_.clear();
  step_order_.clear();
  has_optimizer_.store(optimizer_ != nullptr);
  state_bytes_.store(optimizer_ != nullptr ? optimizer_->state_bytes() : 0);
}

bool HeadTrainingState::Describe(v1::OptimizerInfo* info) const {
  absl::MutexLock lock(&mu_);
  return DescribeLocked(info);
}

bool HeadTrainingState::DescribeLocked(v1::OptimizerInfo* info) const {
  if (optimizer_ == nullptr) return false;
  const OptimizerConfig& config = optimizer_->config();
  info->set_kind(OptimizerKindToProto(config.kind));
  OptimizerGroupToProto(config.kind, config.weight, info->mutable_weight());
  OptimizerGroupToProto(config.kind, config.bias, info->mutable_bias());
  info->set_steps(optimizer_->steps());
  info->set_skipped_steps(skipped_);
  info->set_state_bytes(optimizer_->state_bytes());
  return true;
}

const HeadTrainingState::StepRecord* HeadTrainingState::FindStep(const std::string& request_id) const {
  auto it = steps_.find(request_id);
  return it == steps_.end() ? nullptr : &it->second;
}

void HeadTrainingState::RecordStep(const std::string& request_id, StepRecord record) {
  if (steps_.emplace(request_id, std::move(record)).second) step_order_.push_back(request_id);
  while (step_order_.size() > kStepsRemembered) {
    steps_.erase(step_order_.front());
    step_order_.pop_front();
  }
}

}  // namespace flce::server
