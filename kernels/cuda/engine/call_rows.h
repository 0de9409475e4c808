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

// ValidateComputeSpec (kernels/engine.h), then grad_out (when given): a
// `Buffer`, the engine's own gradient buffer type.
template <typename Buffer>
absl::Status ValidateSpecFor(const ComputeSpec& spec, const HeadSpec& head,
                             const char* engine_name) {
  if (absl::Status st = ValidateComputeSpec(head, spec); !st.ok()) return st;
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

// The per-token rows of one call on the host: its inputs as the row kernels
// read them and its outputs as they come back. On the device and in the
// pinned staging both are blocks of arrays, `stride` entries each, in
// row_types.h's order: input_arrays() of the inputs, output_arrays() of the
// outputs (more under a policy objective).
struct CallRows {
  explicit CallRows(const ComputeSpec& spec);
  // Hidden rows [offset, offset + rows) arrive: INVALID_ARGUMENT when they
  // lie outside the call, overlap rows already given, or (with `host_rows`,
  // their bytes, unless the spec says the caller checked them) hold a
  // non-finite value; else they count as given.
  absl::Status Accept(int64_t offset, int64_t rows, const void* host_rows, int64_t hidden,
                      DType dtype);
  // FAILED_PRECONDITION naming the first token no hidden row was given for.
  absl::Status CheckAllGiven() const;

  int input_arrays() const { return policy ? kRowInputs : kPlainRowInputs; }
  int output_arrays() const { return policy ? kRowOutputs : kPlainRowOutputs; }
  // Input rows [begin, begin + rows) into a host block of `stride`.
  void CopyInputs(int64_t begin, int64_t rows, void* block, int64_t stride) const;
  // Pointers into a device block of `stride` (the entropy and the argmax
  // null unless the call asked for them).
  RowInputs DeviceInputs(void* block, int64_t stride) const;
  RowOutputs DeviceOutputs(float* block, int64_t stride, const OutputSelection& wanted) const;
  // Output rows [begin, begin + rows) from a host block of `stride`.
  void Store(const float* block, int64_t stride, int64_t begin, int64_t rows);
  // Loss, z-loss, entropy, n_valid and the per-token outputs asked for;
  // n_correct with accuracy; the objective's statistics.
  void FillResult(const OutputSelection& wanted, ComputeResult& result) const;

  bool policy = false;
  float kl_coef = 0.0f;
  std::vector<int32_t> target;  // -1 = ignored
  std::vector<float> token_weight;  // a_t; w_t under a policy objective
  std::vector<float> entropy_weight;
  std::vector<float> old_logp, advantage, ref_logp;  // under a policy objective
  int64_t n_valid = 0;
  std::vector<float> loss, z_loss, logprob, entropy;
  std::vector<int32_t> argmax;
  std::vector<float> ratio, log_ratio, kl;  // under a policy objective
  std::vector<int32_t> policy_flags;
  std::vector<uint8_t> given;
  bool scan_host_rows = true;  // false where the caller checked them (ComputeSpec::hidden_checked)
};

// Copies the per-token inputs to a device block of stride n on `stream` and
// waits for the copy.
absl::Status UploadRowInputs(const CallRows& rows, void* block, cudaStream_t stream,
                             DeviceHealth* health);

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
