// The CPU engine's fp32 grad_W (+ grad_b) accumulator in host memory.
#ifndef FLCE_KERNELS_CPU_CPU_GRAD_BUFFER_H_
#define FLCE_KERNELS_CPU_CPU_GRAD_BUFFER_H_

#include <cstdint>
#include <vector>

#include "kernels/engine.h"

namespace flce::cpu {

class CpuGradBuffer : public GradBuffer {
 public:
  CpuGradBuffer(int64_t vocab_size, int64_t hidden_size, bool has_bias);
  int64_t vocab_size() const override { return vocab_size_; }
  int64_t hidden_size() const override { return hidden_size_; }
  bool has_bias() const override { return has_bias_; }
  int64_t bytes() const override;
  absl::Status Zero() override;
  absl::Status AddScaled(const GradBuffer& other, float scale) override;
  absl::StatusOr<FiniteCheck> ScaleAndAdd(float scale, const GradBuffer& base) override;
  absl::StatusOr<bool> AllFinite() const override;
  absl::StatusOr<GradNorms> SquaredNorms() const override;
  absl::Status ScatterAddRows(const int32_t* ids, int64_t n, const void* rows, DType dtype,
                              bool deterministic) override;
  absl::Status CopyWeightRows(int64_t row_begin, int64_t rows, DType out_dtype,
                              void* host_out) const override;
  absl::Status CopyBias(int64_t begin, int64_t count, DType out_dtype,
                        void* host_out) const override;

  float* weight() { return weight_.data(); }  // V x H
  float* bias() { return has_bias_ ? bias_.data() : nullptr; }
  const float* weight() const { return weight_.data(); }
  const float* bias() const { return has_bias_ ? bias_.data() : nullptr; }

 private:
  int64_t vocab_size_;
  int64_t hidden_size_;
  // The same-shape CPU buffer, or INVALID_ARGUMENT naming `op`.
  absl::StatusOr<const CpuGradBuffer*> SameShape(const GradBuffer& other, const char* op) const;

  bool has_bias_;
  std::vector<float> weight_;
  std::vector<float> bias_;
};

}  // namespace flce::cpu

#endif  // FLCE_KERNELS_CPU_CPU_GRAD_BUFFER_H_
