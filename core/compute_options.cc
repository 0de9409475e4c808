#include "core/compute_options.h"

namespace flce {

const char* StrategyName(Strategy strategy) {
  switch (strategy) {
    case Strategy::kAuto:
      return "auto";
    case Strategy::kChunked:
      return "chunked";
    case Strategy::kVocabSplit:
      return "vocab_split";
    case Strategy::kFuseMN:
      return "fuse_mn";
    case Strategy::kSeparate:
      return "separate";
    case Strategy::kNaive:
      return "naive";
  }
  return "unknown";
}

const LossOptionField* FirstOptionOfKindOn(const LossOptions& options, LossOptionKind kind) {
  const LossOptions defaults;
  for (const LossOptionField& field : kLossOptionFields) {
    if (field.kind == kind && options.*field.member != defaults.*field.member) return &field;
  }
  return nullptr;
}

bool OptionsOfKindOff(const LossOptions& options, LossOptionKind kind) {
  return FirstOptionOfKindOn(options, kind) == nullptr;
}

}  // namespace flce
