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

// Each LossOptions field once, with what every layer needs to know of it: its
// name (the same on the wire, flce.v1.LossOptions), the range the server and
// every engine accept, and the CLI's flag. The header check, ValidateComputeSpec
// and `flce-client compute` read their options from here, so that a new option
// is a field above, a row here and its math.
struct LossOptionField {
  const char* name;
  float LossOptions::*member;
  float lo, hi;      // accepted: finite and in [lo, hi]
  bool zero_is_off;  // 0 is accepted too: the option is off
  const char* flag;
  const char* help;  // the flag's, beside the range
};

inline constexpr LossOptionField kLossOptionFields[] = {
    {"label_smoothing", &LossOptions::label_smoothing, 0.0f, 1.0f, false, "label-smoothing",
     "epsilon"},
    {"z_loss_scale", &LossOptions::z_loss_scale, 0.0f, 1e3f, false, "z-loss",
     "z-loss scale s (lse_square_scale)"},
    {"softcap", &LossOptions::softcap, 1e-3f, 1e6f, true, "softcap", "logit softcap c"},
    {"temperature", &LossOptions::temperature, 1e-3f, 1e3f, false, "temperature",
     "temperature tau"},
    {"grad_scale", &LossOptions::grad_scale, -1e12f, 1e12f, false, "grad-scale",
     "multiplies every gradient"},
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
