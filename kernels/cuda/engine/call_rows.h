// The host side every CUDA compute call shares, on one GPU or split across
// several: the spec's checks, the per-token inputs the row kernels read
// (targets with ignored tokens as -1, a_t, e_t), the per-token outputs that
// come back, and the result summed from them.
#ifndef FLCE_KERNELS_CUDA_ENGINE_CALL_ROWS_H_
#define FLCE_KERNELS_CUDA_ENGINE_CALL_ROWS_H_

#include <cstdint>
#include <vector>

#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/cuda/base/cuda_status.h"
#include "kernels/cuda/base/row_types.h"
#include "kernels/cuda/plans/plans.h"
#include "kernels/engine.h"

namespace flce::cuda {

// Row outputs per token on the device and in downloads: loss, z-loss,
// logprob, entropy, argmax, each `stride` entries. The entropy and the
// argmax are left null (not computed) unless the call asked for them.
constexpr int kRowOutputs = 5;
RowOutputs DeviceRowOutputs(float* outputs, int64_t stride, const OutputSelection& wanted);

// ValidateComputeSpec (kernels/engine.h), then grad_out (when given): a
// `Buffer`, the engine's own gradient buffer type. No policy objective
// (EngineInfo::policy_objectives is false).
template <typename Buffer>
absl::Status ValidateSpecFor(const ComputeSpec& spec, const HeadSpec& head,
                             const char* engine_name) {
  if (absl::Status st = ValidateComputeSpec(head, spec); !st.ok()) return st;
  if (spec.policy.has_value()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the ", engine_name, " engine does not compute policy objectives (the cpu engine does)"));
  }
  if (spec.grad_out == nullptr) return absl::OkStatus();
  if (dynamic_cast<const Buffer*>(spec.grad_out) == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("grad_out is not a gradient buffer of the ", engine_name, " engine"));
  }
  return absl::OkStatus();
}

LossParams LossParamsFor(const ComputeSpec& spec, int64_t vocab);

// What the planner needs of the spec (streaming left to the caller).
PlanRequest PlanRequestFor(const ComputeSpec& spec);

struct CallRows {
  explicit CallRows(const ComputeSpec& spec);
  // Hidden rows [offset, offset + rows) arrive: INVALID_ARGUMENT when they
  // lie outside the call, overlap rows already given, or (with `host_rows`,
  // their bytes) hold a non-finite value; else they count as given.
  absl::Status Accept(int64_t offset, int64_t rows, const void* host_rows, int64_t hidden,
                      DType dtype);
  // FAILED_PRECONDITION naming the first token no hidden row was given for.
  absl::Status CheckAllGiven() const;
  // Output rows [begin, begin + rows) from a download laid out as above.
  void Store(const float* outputs, int64_t stride, int64_t begin, int64_t rows);
  // Loss, z-loss, entropy, n_valid and the per-token outputs asked for;
  // n_correct with accuracy.
  void FillResult(const OutputSelection& wanted, ComputeResult& result) const;

  std::vector<int32_t> target;  // -1 = ignored
  std::vector<float> token_weight;
  std::vector<float> entropy_weight;
  int64_t n_valid = 0;
  std::vector<float> loss, z_loss, logprob, entropy;
  std::vector<int32_t> argmax;
  std::vector<uint8_t> given;
};

// Starts copying the per-token inputs (targets, a_t, e_t) to the device
// arrays on `stream`; `rows` must outlive the copies.
absl::Status UploadRowInputs(const CallRows& rows, int32_t* target, float* token_weight,
                             float* entropy_weight, cudaStream_t stream, DeviceHealth* health);

// A whole request's results on the device, for calls that compute at
// Finish: the per-token outputs (laid out as above, stride n) into `rows`,
// and, with `grad_input` (n rows of row_bytes), its rows to the sink in
// pieces of 8192. On `stream`, waiting for each copy.
absl::Status DownloadRowOutputs(const float* outputs, int64_t n, cudaStream_t stream,
                                DeviceHealth* health, CallRows& rows);
absl::Status SinkGradInput(const char* grad_input, int64_t n, int64_t row_bytes,
                           const GradInputSink& sink, cudaStream_t stream, DeviceHealth* health);

}  // namespace flce::cuda

#endif  // FLCE_KERNELS_CUDA_ENGINE_CALL_ROWS_H_
