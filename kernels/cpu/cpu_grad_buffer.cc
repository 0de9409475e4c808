#include "kernels/cpu/cpu_grad_buffer.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace flce::cpu {
namespace {

absl::Status CheckCopy(const char* what, int64_t begin, int64_t count, int64_t limit,
                       DType out_dtype, const void* host_out) {
  if (begin < 0 || count < 0 || begin > limit || count > limit - begin) {
    return absl::OutOfRangeError(absl::StrCat(what, " [", begin, ", ", begin + count,
                                              ") outside [0, ", limit, ")"));
  }
  if (out_dtype == DType::kF16) {
    return absl::InvalidArgumentError("gradients are copied out as fp32 or bf16, not fp16");
  }
  if (count > 0 && host_out == nullptr) return absl::InvalidArgumentError("output is null");
  return absl::OkStatus();
}

}  // namespace

CpuGradBuffer::CpuGradBuffer(int64_t vocab_size, int64_t hidden_size, bool has_bias)
    : vocab_size_(vocab_size),
      hidden_size_(hidden_size),
      has_bias_(has_bias),
      weight_(vocab_size * hidden_size, 0.0f),
      bias_(has_bias ? vocab_size : 0, 0.0f) {}

int64_t CpuGradBuffer::bytes() const {
  return static_cast<int64_t>((weight_.size() + bias_.size()) * sizeof(float));
}

absl::Status CpuGradBuffer::Zero() {
  std::fill(weight_.begin(), weight_.end(), 0.0f);
  std::fill(bias_.begin(), bias_.end(), 0.0f);
  return absl::OkStatus();
}

absl::Status CpuGradBuffer::AddScaled(const GradBuffer& other, float scale) {
  const auto* cpu = dynamic_cast<const CpuGradBuffer*>(&other);
  if (cpu == nullptr) {
    return absl::InvalidArgumentError("AddScaled: the other buffer is not a CPU engine buffer");
  }
  if (cpu->vocab_size_ != vocab_size_ || cpu->hidden_size_ != hidden_size_ ||
      cpu->has_bias_ != has_bias_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "AddScaled: shape ", cpu->vocab_size_, " x ", cpu->hidden_size_,
        cpu->has_bias_ ? " + bias" : "", " differs from ", vocab_size_, " x ", hidden_size_,
        has_bias_ ? " + bias" : ""));
  }
  const size_t n = weight_.size();
  const float* src = cpu->weight_.data();
  float* dst = weight_.data();
  for (size_t i = 0; i < n; ++i) dst[i] += scale * src[i];
  for (size_t i = 0; i < bias_.size(); ++i) bias_[i] += scale * cpu->bias_[i];
  return absl::OkStatus();
}

absl::Status CpuGradBuffer::CopyWeightRows(int64_t row_begin, int64_t rows, DType out_dtype,
                                           void* host_out) const {
  absl::Status status =
      CheckCopy("weight rows", row_begin, rows, vocab_size_, out_dtype, host_out);
  if (!status.ok()) return status;
  FromFloat(out_dtype, weight_.data() + row_begin * hidden_size_, host_out, rows * hidden_size_);
  return absl::OkStatus();
}

absl::Status CpuGradBuffer::CopyBias(int64_t begin, int64_t count, DType out_dtype,
                                     void* host_out) const {
  if (!has_bias_) return absl::FailedPreconditionError("gradient buffer has no bias");
  absl::Status status = CheckCopy("bias elements", begin, count, vocab_size_, out_dtype, host_out);
  if (!status.ok()) return status;
  FromFloat(out_dtype, bias_.data() + begin, host_out, count);
  return absl::OkStatus();
}

}  // namespace flce::cpu
