// What a compute request asks for, as every layer names it: the reduction,
// the strategy, MATH.md's loss options and the outputs. The wire spells them
// in proto/ (convert.h maps the enums), the engines read them from
// kernels/engine.h's ComputeSpec.
#ifndef FLCE_CORE_COMPUTE_OPTIONS_H_
#define FLCE_CORE_COMPUTE_OPTIONS_H_

namespace flce {

enum class Reduction { kMean, kSum, kNone };

enum class Strategy { kAuto, kChunked, kVocabSplit, kFuseMN, kSeparate, kNaive };

// "auto", "chunked", "vocab_split", "fuse_mn", "separate", "naive".
const char* StrategyName(Strategy strategy);

// MATH.md's symbols; defaults are the plain cross-entropy.
struct LossOptions {
  float label_smoothing = 0.0f;  // epsilon
  float z_loss_scale = 0.0f;     // s
  float softcap = 0.0f;          // c; 0 = none
  float temperature = 1.0f;      // tau
  float grad_scale = 1.0f;
};

struct OutputSelection {
  bool grad_input = true;
  bool per_token_loss = false;
  bool logprob = false;
  bool entropy = false;
  bool accuracy = false;
};

}  // namespace flce

#endif  // FLCE_CORE_COMPUTE_OPTIONS_H_
