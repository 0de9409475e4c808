#include "kernels/engine.h"

#include "absl/strings/str_cat.h"

namespace flce {

absl::Status CheckRowIds(const int32_t* ids, int64_t n, int64_t vocab_size) {
  for (int64_t i = 0; i < n; ++i) {
    if (ids[i] < 0 || ids[i] >= vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("token id ", ids[i], " at index ", i, " is outside [0, ", vocab_size, ")"));
    }
  }
  return absl::OkStatus();
}

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
