// An fp32 gradient accumulator on the GPU (padded_vocab x H weight +
// padded_vocab bias): a session's grad_W or one call's staged contribution.
#ifndef FLCE_KERNELS_CUDA_ENGINE_CUDA_GRAD_BUFFER_H_
#define FLCE_KERNELS_CUDA_ENGINE_CUDA_GRAD_BUFFER_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "kernels/cuda/base/device_memory.h"
#include "kernels/cuda/engine/device_context.h"
#include "kernels/engine.h"

namespace flce::cuda {

class CudaGradBuffer : public GradBuffer {
 public:
  static absl::StatusOr<std::unique_ptr<CudaGradBuffer>> Create(std::shared_ptr<DeviceContext> ctx,
                                                                const HeadSpec& spec);
  // Its memory goes to the context's spares (DeviceContext::KeepGradMemory).
  ~CudaGradBuffer() override;
  int64_t vocab_size() const override { return vocab_; }
  int64_t hidden_size() const override { return hidden_; }
  bool has_bias() const override { return has_bias_; }
  int64_t bytes() const override { return data_.bytes(); }
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

  float* weight() const { return static_cast<float*>(data_.get()); }
  float* bias() const { return has_bias_ ? weight() + padded_vocab_ * hidden_ : nullptr; }
  int64_t padded_vocab() const { return padded_vocab_; }
  const DeviceContext* context() const { return ctx_.get(); }

 private:
  CudaGradBuffer() = default;
  // The weight's and the bias's real elements: the rows padding V to the
  // GEMMs' multiple hold whatever the plans left there, never read.
  DeviceContext::Ranges RealRanges() const;
  // The same-shape buffer of this engine, or INVALID_ARGUMENT naming `op`.
  absl::StatusOr<const CudaGradBuffer*> SameShape(const GradBuffer& other, const char* op) const;
  absl::Status CopyOut(const float* src, int64_t count, DType out_dtype, void* host_out) const;
  std::shared_ptr<DeviceContext> ctx_;
  int64_t vocab_ = 0;
  int64_t hidden_ = 0;
  int64_t padded_vocab_ = 0;
  bool has_bias_ = false;
  DeviceBuffer data_;
};

}  // namespace flce::cuda

#endif  // FLCE_KERNELS_CUDA_ENGINE_CUDA_GRAD_BUFFER_H_
