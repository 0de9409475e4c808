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

}  // namespace flce
