// A resident head on the GPU (V padded to a multiple of 128 with zero rows, in
// its dtype) and the builder that streams its bytes in through pinned staging.
#ifndef FLCE_KERNELS_CUDA_ENGINE_CUDA_HEAD_H_
#define FLCE_KERNELS_CUDA_ENGINE_CUDA_HEAD_H_

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/cuda/base/device_memory.h"
#include "kernels/cuda/engine/device_context.h"
#include "kernels/cuda/plans/plans.h"
#include "kernels/engine.h"

namespace flce::cuda {

class CudaHead : public Head {
 public:
  CudaHead(std::shared_ptr<DeviceContext> ctx, HeadSpec spec, DeviceBuffer weight,
           DeviceBuffer bias);
  const HeadSpec& spec() const override { return spec_; }
  int64_t resident_bytes() const override { return weight_.bytes() + bias_.bytes(); }
  absl::Status CopyOut(HeadTensor tensor, int64_t begin, int64_t count,
                       void* host_out) const override;
  absl::Status GatherRows(const int32_t* ids, int64_t n, DType out_dtype,
                          void* host_out) const override;
  int64_t padded_vocab() const { return padded_vocab_; }
  HeadView view() const;
  // For CudaHeadOptimizer only, while no compute call uses the head.
  void* weight_for_update() const { return weight_.get(); }
  void* bias_for_update() const { return bias_.get(); }
  const std::shared_ptr<DeviceContext>& context() const { return ctx_; }

 private:
  std::shared_ptr<DeviceContext> ctx_;
  HeadSpec spec_;
  int64_t padded_vocab_;
  DeviceBuffer weight_;
  DeviceBuffer bias_;
};

class CudaHeadBuilder : public HeadBuilder {
 public:
  static absl::StatusOr<std::unique_ptr<CudaHeadBuilder>> Create(std::shared_ptr<DeviceContext> ctx,
                                                                 const HeadSpec& spec);
  absl::Status WriteWeight(int64_t byte_offset, const void* data, int64_t bytes) override;
  absl::Status WriteBias(int64_t byte_offset, const void* data, int64_t bytes) override;
  absl::StatusOr<std::shared_ptr<const Head>> Finish() override;

 private:
  CudaHeadBuilder() = default;
  absl::Status Write(bool bias, int64_t byte_offset, const void* data, int64_t bytes);
  std::shared_ptr<DeviceContext> ctx_;
  HeadSpec spec_;
  DeviceBuffer weight_;
  DeviceBuffer bias_;
  std::vector<std::pair<int64_t, int64_t>> weight_written_;
  std::vector<std::pair<int64_t, int64_t>> bias_written_;
  bool finished_ = false;
};

}  // namespace flce::cuda

#endif  // FLCE_KERNELS_CUDA_ENGINE_CUDA_HEAD_H_
