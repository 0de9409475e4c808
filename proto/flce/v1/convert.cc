#include "flce/v1/convert.h"

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace flce {

namespace {

// kLossOptionFields' names are flce.v1.LossOptions' float fields
// (tests/server/loss_option_table_test.cc): INTERNAL if one is not.
absl::StatusOr<const google::protobuf::FieldDescriptor*> LossOptionDescriptor(
    const LossOptionField& field) {
  const google::protobuf::FieldDescriptor* fd =
      v1::LossOptions::descriptor()->FindFieldByName(field.name);
  if (fd == nullptr || fd->cpp_type() != google::protobuf::FieldDescriptor::CPPTYPE_FLOAT) {
    return absl::InternalError(
        absl::StrCat("flce.v1.LossOptions has no float field ", field.name));
  }
  return fd;
}

}  // namespace

absl::StatusOr<LossOptions> LossOptionsFromProto(const v1::LossOptions& options) {
  LossOptions out;
  const google::protobuf::Reflection* reflection = options.GetReflection();
  for (const LossOptionField& field : kLossOptionFields) {
    FLCE_ASSIGN_OR_RETURN(const google::protobuf::FieldDescriptor* fd, LossOptionDescriptor(field));
    if (reflection->HasField(options, fd)) out.*field.member = reflection->GetFloat(options, fd);
  }
  return out;
}

absl::Status SetLossOption(const LossOptionField& field, float value, v1::LossOptions* options) {
  FLCE_ASSIGN_OR_RETURN(const google::protobuf::FieldDescriptor* fd, LossOptionDescriptor(field));
  options->GetReflection()->SetFloat(options, fd, value);
  return absl::OkStatus();
}

absl::StatusOr<DType> DTypeFromProto(v1::DType dtype, absl::string_view field) {
  switch (dtype) {
    case v1::DTYPE_FP32:
      return DType::kF32;
    case v1::DTYPE_FP16:
      return DType::kF16;
    case v1::DTYPE_BF16:
      return DType::kBF16;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat(field, " = ", EnumValueText(v1::DType_descriptor(), dtype),
                       " is not one of DTYPE_FP32, DTYPE_FP16, DTYPE_BF16"));
  }
}

std::string EnumValueText(const google::protobuf::EnumDescriptor* type, int value) {
  const google::protobuf::EnumValueDescriptor* known = type->FindValueByNumber(value);
  if (known == nullptr) return absl::StrCat(value);
  return absl::StrCat(known->name(), " (", value, ")");
}

v1::DType DTypeToProto(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return v1::DTYPE_FP32;
    case DType::kF16:
      return v1::DTYPE_FP16;
    case DType::kBF16:
      return v1::DTYPE_BF16;
  }
  return v1::DTYPE_UNSPECIFIED;
}

absl::Status UnknownEnumError(absl::string_view field,
                              const google::protobuf::EnumDescriptor* type, int value) {
  std::string known;
  for (int i = 0; i < type->value_count(); ++i) {
    absl::StrAppend(&known, i == 0 ? "" : ", ", type->value(i)->name());
  }
  return absl::InvalidArgumentError(
      absl::StrCat(field, " = ", EnumValueText(type, value), " is not one of ", known));
}

absl::StatusOr<PolicyLoss> PolicyLossFromProto(v1::PolicyLoss loss) {
  switch (loss) {
    case v1::POLICY_LOSS_PPO_CLIP:
      return PolicyLoss::kPpoClip;
    case v1::POLICY_LOSS_CISPO:
      return PolicyLoss::kCispo;
    default:
      return UnknownEnumError("policy.loss", v1::PolicyLoss_descriptor(), loss);
  }
}

absl::StatusOr<PreferenceLoss> PreferenceLossFromProto(v1::PreferenceLoss loss) {
  switch (loss) {
    case v1::PREFERENCE_LOSS_DPO_SIGMOID:
      return PreferenceLoss::kDpoSigmoid;
    case v1::PREFERENCE_LOSS_IPO:
      return PreferenceLoss::kIpo;
    case v1::PREFERENCE_LOSS_DPO_HINGE:
      return PreferenceLoss::kDpoHinge;
    case v1::PREFERENCE_LOSS_SIMPO:
      return PreferenceLoss::kSimPo;
    case v1::PREFERENCE_LOSS_ORPO:
      return PreferenceLoss::kOrpo;
    default:
      return UnknownEnumError("preference.loss", v1::PreferenceLoss_descriptor(), loss);
  }
}

void PreferenceSummaryToProto(PreferenceLoss loss, const PreferenceStats& stats,
                              v1::PreferenceSummary* out) {
  out->set_loss(PreferenceLossName(loss));
  out->set_pairs(stats.pairs);
  out->set_pair_loss(stats.pair_loss);
  out->set_nll_loss(stats.nll_loss);
  if (stats.pairs == 0) return;
  const double p = static_cast<double>(stats.pairs);
  out->set_chosen_reward_mean(stats.chosen_reward_sum / p);
  out->set_rejected_reward_mean(stats.rejected_reward_sum / p);
  out->set_reward_accuracy(static_cast<double>(stats.reward_accurate) / p);
  out->set_reward_margin_mean((stats.chosen_reward_sum - stats.rejected_reward_sum) / p);
  out->set_chosen_logp_mean(stats.chosen_logp_sum / p);
  out->set_rejected_logp_mean(stats.rejected_logp_sum / p);
}

absl::StatusOr<KlEstimator> KlEstimatorFromProto(v1::KlEstimator estimator) {
  switch (estimator) {
    case v1::KL_ESTIMATOR_K3:
      return KlEstimator::kK3;
    case v1::KL_ESTIMATOR_K1:
      return KlEstimator::kK1;
    default:
      return UnknownEnumError("policy.kl_estimator", v1::KlEstimator_descriptor(), estimator);
  }
}

absl::StatusOr<LossAggregation> LossAggregationFromProto(v1::LossAggregation aggregation) {
  switch (aggregation) {
    case v1::LOSS_AGGREGATION_TOKEN_MEAN:
      return LossAggregation::kTokenMean;
    case v1::LOSS_AGGREGATION_SEQ_MEAN_TOKEN_SUM:
      return LossAggregation::kSeqMeanTokenSum;
    case v1::LOSS_AGGREGATION_SEQ_MEAN_TOKEN_MEAN:
      return LossAggregation::kSeqMeanTokenMean;
    default:
      return UnknownEnumError("policy.aggregation", v1::LossAggregation_descriptor(),
                              aggregation);
  }
}

void PolicySummaryToProto(PolicyLoss loss, const PolicyStats& stats, v1::PolicySummary* out) {
  out->set_loss(PolicyLossName(loss));
  out->set_tokens(stats.tokens);
  out->set_surrogate_loss(stats.surrogate_loss);
  out->set_kl_loss(stats.kl_loss);
  if (stats.tokens == 0) return;
  const double n = static_cast<double>(stats.tokens);
  out->set_clip_fraction_low(static_cast<double>(stats.clipped_low) / n);
  out->set_clip_fraction_high(static_cast<double>(stats.clipped_high) / n);
  out->set_dual_clip_fraction(static_cast<double>(stats.dual_clipped) / n);
  out->set_approx_kl(stats.old_minus_logp_sum / n);
  out->set_kl_mean(stats.kl_sum / n);
  out->set_ratio_mean(stats.ratio_sum / n);
  out->set_ratio_min(stats.ratio_min);
  out->set_ratio_max(stats.ratio_max);
}

absl::StatusOr<Reduction> ReductionFromProto(v1::Reduction reduction) {
  switch (reduction) {
    case v1::REDUCTION_MEAN:
      return Reduction::kMean;
    case v1::REDUCTION_SUM:
      return Reduction::kSum;
    case v1::REDUCTION_NONE:
      return Reduction::kNone;
    default:
      return UnknownEnumError("reduction", v1::Reduction_descriptor(), reduction);
  }
}

absl::StatusOr<Strategy> StrategyFromProto(v1::Strategy strategy) {
  switch (strategy) {
    case v1::STRATEGY_AUTO:
      return Strategy::kAuto;
    case v1::STRATEGY_CHUNKED:
      return Strategy::kChunked;
    case v1::STRATEGY_VOCAB_SPLIT:
      return Strategy::kVocabSplit;
    case v1::STRATEGY_FUSE_MN:
      return Strategy::kFuseMN;
    case v1::STRATEGY_SEPARATE:
      return Strategy::kSeparate;
    case v1::STRATEGY_NAIVE:
      return Strategy::kNaive;
    default:
      return UnknownEnumError("strategy", v1::Strategy_descriptor(), strategy);
  }
}

absl::StatusOr<OptimizerKind> OptimizerKindFromProto(v1::OptimizerKind kind) {
  switch (kind) {
    case v1::OPTIMIZER_SGD:
      return OptimizerKind::kSgd;
    case v1::OPTIMIZER_ADAMW:
      return OptimizerKind::kAdamW;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("kind = ", EnumValueText(v1::OptimizerKind_descriptor(), kind),
                       " is not one of OPTIMIZER_SGD, OPTIMIZER_ADAMW"));
  }
}

v1::OptimizerKind OptimizerKindToProto(OptimizerKind kind) {
  return kind == OptimizerKind::kSgd ? v1::OPTIMIZER_SGD : v1::OPTIMIZER_ADAMW;
}

absl::StatusOr<OptimizerGroup> OptimizerGroupFromProto(OptimizerKind kind,
                                                       const v1::OptimizerGroup& group,
                                                       absl::string_view group_name) {
  OptimizerGroup out = DefaultOptimizerGroup(kind);
  if (group.has_weight_decay()) out.weight_decay = group.weight_decay();
  const char* foreign = nullptr;
  if (kind == OptimizerKind::kSgd) {
    if (group.has_beta1()) foreign = "beta1";
    if (group.has_beta2()) foreign = "beta2";
    if (group.has_eps()) foreign = "eps";
    if (group.amsgrad()) foreign = "amsgrad";
    out.momentum = group.momentum();
    out.dampening = group.dampening();
    out.nesterov = group.nesterov();
  } else {
    if (group.momentum() != 0.0) foreign = "momentum";
    if (group.dampening() != 0.0) foreign = "dampening";
    if (group.nesterov()) foreign = "nesterov";
    if (group.has_beta1()) out.beta1 = group.beta1();
    if (group.has_beta2()) out.beta2 = group.beta2();
    if (group.has_eps()) out.eps = group.eps();
    out.amsgrad = group.amsgrad();
  }
  if (foreign != nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(group_name, " group: ", foreign,
                                                   " is not a parameter of ", OptimizerName(kind)));
  }
  return out;
}

void OptimizerGroupToProto(OptimizerKind kind, const OptimizerGroup& group,
                           v1::OptimizerGroup* out) {
  out->set_weight_decay(group.weight_decay);
  if (kind == OptimizerKind::kSgd) {
    out->set_momentum(group.momentum);
    out->set_dampening(group.dampening);
    out->set_nesterov(group.nesterov);
    return;
  }
  out->set_beta1(group.beta1);
  out->set_beta2(group.beta2);
  out->set_eps(group.eps);
  out->set_amsgrad(group.amsgrad);
}

}  // namespace flce
