// The wire's enums <-> core's (DType, Reduction, Strategy, OptimizerKind, the
// optimizer's groups): the one mapping the server and the C++ client share.
//
// Usage:
//   FLCE_ASSIGN_OR_RETURN(DType dtype, DTypeFromProto(header.hidden_dtype(),
//   "hidden_dtype")); info.set_dtype(DTypeToProto(head.spec().dtype));
#ifndef FLCE_PROTO_FLCE_V1_CONVERT_H_
#define FLCE_PROTO_FLCE_V1_CONVERT_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/compute_options.h"
#include "core/dtype.h"
#include "core/optimizer_config.h"
#include "core/policy_objective.h"
#include "core/preference_objective.h"
#include "flce/v1/flce.pb.h"

namespace flce {

// The wire's LossOptions as core's, field by field through kLossOptionFields
// (names alike on both sides): a field the message leaves unset keeps core's
// default. Ranges are not checked here: CheckLossOptions does that for every
// caller.
absl::StatusOr<LossOptions> LossOptionsFromProto(const v1::LossOptions& options);

// Sets `field` of the wire's LossOptions (a kLossOptionFields entry), as a
// client does for an option its user gave.
absl::Status SetLossOption(const LossOptionField& field, float value, v1::LossOptions* options);

// INVALID_ARGUMENT naming `field` for DTYPE_UNSPECIFIED or an unknown value.
absl::StatusOr<DType> DTypeFromProto(v1::DType dtype, absl::string_view field = "dtype");
v1::DType DTypeToProto(DType dtype);

// An enum value as an error message shows it: "DTYPE_UNSPECIFIED (0)", or
// just the number for a value the enum does not define (proto3 keeps those).
std::string EnumValueText(const google::protobuf::EnumDescriptor* type, int value);

// INVALID_ARGUMENT naming `field`, the value and every value `type` defines.
absl::Status UnknownEnumError(absl::string_view field,
                              const google::protobuf::EnumDescriptor* type, int value);

// INVALID_ARGUMENT (UnknownEnumError) for a value the enum does not define.
absl::StatusOr<Reduction> ReductionFromProto(v1::Reduction reduction);
absl::StatusOr<Strategy> StrategyFromProto(v1::Strategy strategy);
// POLICY_LOSS_NONE is no objective: the caller checks for it first.
absl::StatusOr<PolicyLoss> PolicyLossFromProto(v1::PolicyLoss loss);
absl::StatusOr<KlEstimator> KlEstimatorFromProto(v1::KlEstimator estimator);
absl::StatusOr<LossAggregation> LossAggregationFromProto(v1::LossAggregation aggregation);
// The summary's fractions and means over stats.tokens (0 when none counted).
void PolicySummaryToProto(PolicyLoss loss, const PolicyStats& stats, v1::PolicySummary* out);
// PREFERENCE_LOSS_NONE is no objective: the caller checks for it first.
absl::StatusOr<PreferenceLoss> PreferenceLossFromProto(v1::PreferenceLoss loss);
// The summary's means over stats.pairs.
void PreferenceSummaryToProto(PreferenceLoss loss, const PreferenceStats& stats,
                              v1::PreferenceSummary* out);

// INVALID_ARGUMENT for OPTIMIZER_UNSPECIFIED or an unknown value.
absl::StatusOr<OptimizerKind> OptimizerKindFromProto(v1::OptimizerKind kind);
v1::OptimizerKind OptimizerKindToProto(OptimizerKind kind);

// The group with torch's defaults for unset fields. INVALID_ARGUMENT naming
// `group_name` for a field the kind has no use for (SGD's betas, AdamW's
// momentum): torch's constructors do not take them either. The values are
// not validated here (ValidateOptimizerGroup).
absl::StatusOr<OptimizerGroup> OptimizerGroupFromProto(OptimizerKind kind,
                                                       const v1::OptimizerGroup& group,
                                                       absl::string_view group_name);
// Every field of the kind, as applied.
void OptimizerGroupToProto(OptimizerKind kind, const OptimizerGroup& group,
                           v1::OptimizerGroup* out);

}  // namespace flce

#endif  // FLCE_PROTO_FLCE_V1_CONVERT_H_
