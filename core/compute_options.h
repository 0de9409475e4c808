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

// What a plan may assume of an option that is on: the CUDA engine's fast paths
// serve the options they were written for, and a call with any other option on
// takes a path that serves every option (the row kernels' dlogits pass).
enum class LossOptionKind {
  // Changes the logits before the softmax (a softcap, a temperature): plans
  // whose GEMM takes the plain x . W (the logits-stats GEMM) do not serve it.
  kLogitTransform,
  // Multiplies every gradient (grad_scale): every path serves it.
  kGradientScale,
  // A term of the row's loss whose dlogits stay one factor per row times the
  // softmax, but for the target's entry (the z-loss): the row-scaled backward
  // serves it.
  kRowScale,
  // Any other term of a row's loss and gradient (label smoothing).
  kRowTerm,
};

// Each LossOptions field once, with what every layer needs to know of it: its
// name (the same on the wire, flce.v1.LossOptions), the range the server and
// every engine accept, the CLI's flag and its kind. The header check,
// ValidateComputeSpec, `flce-client compute` and the CUDA plans' choice read
// their options from here, so that a new option is a field above, a row here
// and its math.
struct LossOptionField {
  const char* name;
  float LossOptions::*member;
  float lo, hi;      // accepted: finite and in [lo, hi]
  bool zero_is_off;  // 0 is accepted too: the option is off
  LossOptionKind kind;
  const char* flag;
  const char* help;  // the flag's, beside the range
};

inline constexpr LossOptionField kLossOptionFields[] = {
    {"label_smoothing", &LossOptions::label_smoothing, 0.0f, 1.0f, false,
     LossOptionKind::kRowTerm, "label-smoothing", "epsilon"},
    {"z_loss_scale", &LossOptions::z_loss_scale, 0.0f, 1e3f, false, LossOptionKind::kRowScale,
     "z-loss", "z-loss scale s (lse_square_scale)"},
    {"softcap", &LossOptions::softcap, 1e-3f, 1e6f, true, LossOptionKind::kLogitTransform,
     "softcap", "logit softcap c"},
    {"temperature", &LossOptions::temperature, 1e-3f, 1e3f, false,
     LossOptionKind::kLogitTransform, "temperature", "temperature tau"},
    {"grad_scale", &LossOptions::grad_scale, -1e12f, 1e12f, false,
     LossOptionKind::kGradientScale, "grad-scale", "multiplies every gradient"},
};

// No option of `kind` differs from its default.
bool OptionsOfKindOff(const LossOptions& options, LossOptionKind kind);

// The first option of `kind` that differs from its default; null if none.
const LossOptionField* FirstOptionOfKindOn(const LossOptions& options, LossOptionKind kind);

// The logits are x . W (+ bias) as they are: no logit transform is on.
inline bool PlainLogits(const LossOptions& options) {
  return OptionsOfKindOff(options, LossOptionKind::kLogitTransform);
}

// dlogits are one factor per row times the softmax but for the target's
// entry: plain logits and no row term on.
inline bool DlogitsScalePerRow(const LossOptions& options) {
  return PlainLogits(options) && OptionsOfKindOff(options, LossOptionKind::kRowTerm);
}

struct OutputSelection {
  bool grad_input = true;
  bool per_token_loss = false;
  bool logprob = false;
  bool entropy = false;
  bool accuracy = false;
};

}  // namespace flce

#endif  // FLCE_CORE_COMPUTE_OPTIONS_H_
