#include "kernels/cpu/cpu_grad_buffer.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace flce::cpu {
namespace {

absl::Status CheckCopy(const char* what, int64_t begin, int64_t count, int64_t limit,
                       DType out_dtype, const void* host_out) {
  if (begin < 0 || count < 0 || begin > limit || count > limit - begin) {
    return absl::OutOfRangeError(
        absl::StrCat(what, " [", begin, ", ", begin + count, ") outside [0, ", limit, ")"));
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

absl::StatusOr<const CpuGradBuffer*> CpuGradBuffer::SameShape(const GradBuffer& other,
                                                              const char* op) const {
  const auto* cpu = dynamic_cast<const CpuGradBuffer*>(&other);
  if (cpu == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": the other buffer is not a CPU engine buffer"));
  }
  if (cpu->vocab_size_ != vocab_size_ || cpu->hidden_size_ != hidden_size_ ||
      cpu->has_bias_ != has_bias_) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": shape ", cpu->vocab_size_, " x ", cpu->hidden_size_, cpu->has_bias_ ? " + bias" : "",
        " differs from ", vocab_size_, " x ", hidden_size_, has_bias_ ? " + bias" : ""));
  }
  return cpu;
}

absl::Status CpuGradBuffer::AddScaled(const GradBuffer& other, float scale) {
  absl::StatusOr<const CpuGradBuffer*> cpu = SameShape(other, "AddScaled");
  if (!cpu.ok()) return cpu.status();
  const size_t n = weight_.size();
  const float* src = (*cpu)->weight_.data();
  float* dst = weight_.data();
  for (size_t i = 0; i < n; ++i) dst[i] += scale * src[i];
  for (size_t i = 0; i < bias_.size(); ++i) bias_[i] += scale * (*cpu)->bias_[i];
  return absl::OkStatus();
}

namespace {

// 1 when x is NaN or Inf: its exponent bits are all ones. Integer arithmetic
// so that the loops below vectorize (std::isfinite does not).
inline uint32_t NonFiniteBit(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  return (bits & 0x7f800000u) == 0x7f800000u;
}

// inout = base + scale * inout over n elements; bit 0: a contribution was not
// finite, bit 1: a sum was not finite.
uint32_t ScaleAddChecked(float scale, const float* base, float* inout, size_t n) {
  uint32_t bad_contribution = 0, bad_sum = 0;
  for (size_t i = 0; i < n; ++i) {
    const float v = scale * inout[i];
    const float s = base[i] + v;
    inout[i] = s;
    bad_contribution |= NonFiniteBit(v);
    bad_sum |= NonFiniteBit(s);
  }
  return bad_contribution | (bad_sum << 1);
}

bool AllFiniteIn(const std::vector<float>& values) {
  uint32_t bad = 0;
  for (float v : values) bad |= NonFiniteBit(v);
  return bad == 0;
}

// Four fp64 lanes summed in a fixed order: the same buffer always gives the
// same bits, and the loop vectorises.
double SumOfSquares(const std::vector<float>& values) {
  double lanes[4] = {0.0, 0.0, 0.0, 0.0};
  const size_t n = values.size();
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    for (int k = 0; k < 4; ++k) {
      const double x = values[i + k];
      lanes[k] += x * x;
    }
  }
  for (; i < n; ++i) {
    const double x = values[i];
    lanes[0] += x * x;
  }
  return (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
}

}  // namespace

absl::StatusOr<FiniteCheck> CpuGradBuffer::ScaleAndAdd(float scale, const GradBuffer& base) {
  absl::StatusOr<const CpuGradBuffer*> cpu = SameShape(base, "ScaleAndAdd");
  if (!cpu.ok()) return cpu.status();
  uint32_t bad = ScaleAddChecked(scale, (*cpu)->weight_.data(), weight_.data(), weight_.size());
  bad |= ScaleAddChecked(scale, (*cpu)->bias_.data(), bias_.data(), bias_.size());
  return FiniteCheck{(bad & 1u) == 0, (bad & 2u) == 0};
}

absl::Status CpuGradBuffer::ScatterAddRows(const int32_t* ids, int64_t n, const void* rows,
                                           DType dtype, bool /*deterministic*/) {
  // One thread, rows in the order given: always deterministic.
  FLCE_RETURN_IF_ERROR(CheckRowIds(ids, n, vocab_size_));
  const int64_t h = hidden_size_;
  std::vector<float> row(h);
  for (int64_t i = 0; i < n; ++i) {
    ToFloat(dtype, static_cast<const char*>(rows) + i * h * DTypeSize(dtype), row.data(), h);
    float* out = weight_.data() + ids[i] * h;
    for (int64_t c = 0; c < h; ++c) out[c] += row[c];
  }
  return absl::OkStatus();
}

absl::StatusOr<GradNorms> CpuGradBuffer::SquaredNorms() const {
  return GradNorms{SumOfSquares(weight_), SumOfSquares(bias_)};
}

absl::StatusOr<bool> CpuGradBuffer::AllFinite() const {
  return AllFiniteIn(weight_) && AllFiniteIn(bias_);
}

absl::Status CpuGradBuffer::CopyWeightRows(int64_t row_begin, int64_t rows, DType out_dtype,
                                           void* host_out) const {
  absl::Status status = CheckCopy("weight rows", row_begin, rows, vocab_size_, out_dtype, host_out);
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
