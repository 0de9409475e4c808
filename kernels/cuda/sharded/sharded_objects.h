// What a head split by vocabulary across GPUs is made of: each shard is an
// ordinary CUDA-engine head (its rows of W and the bias) on its GPU, and
// everything the server asks of a head, a gradient buffer or an optimizer
// is routed row by row to the shards that hold those rows.
#ifndef FLCE_KERNELS_CUDA_SHARDED_SHARDED_OBJECTS_H_
#define FLCE_KERNELS_CUDA_SHARDED_SHARDED_OBJECTS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/cuda/engine/cuda_engine.h"
#include "kernels/cuda/engine/cuda_grad_buffer.h"
#include "kernels/cuda/engine/cuda_head.h"
#include "kernels/cuda/engine/cuda_optimizer.h"
#include "kernels/cuda/engine/device_context.h"
#include "kernels/engine.h"

namespace flce::cuda {

// Vocabulary rows [begin[s], begin[s + 1]) live on shard s. Shards get
// ceil(V / N) rows rounded up to 4 (the row kernels' vector width) each, the
// last one the rest; a head smaller than that leaves trailing shards empty.
struct VocabShards {
  std::vector<int64_t> begin;  // N + 1 boundaries, begin[0] = 0, begin[N] = V

  static VocabShards Split(int64_t vocab, int shards);
  int count() const { return static_cast<int>(begin.size()) - 1; }
  int64_t rows(int s) const { return begin[s + 1] - begin[s]; }
  int ShardOf(int64_t row) const;
  // Elements [first, first + n) of a row-major array of `unit` elements per
  // vocabulary row, in pieces by shard: fn(shard, first element in the
  // shard, elements, elements before this piece), in order.
  using PieceFn = std::function<absl::Status(int, int64_t, int64_t, int64_t)>;
  absl::Status ForEachPiece(int64_t unit, int64_t first, int64_t n, const PieceFn& fn) const;
};

// The head's spec restricted to shard s's rows.
HeadSpec ShardSpec(const HeadSpec& spec, const VocabShards& shards, int s);

class ShardedHead : public Head {
 public:
  // parts[s] is null for an empty shard.
  ShardedHead(HeadSpec spec, VocabShards shards, std::vector<std::shared_ptr<const CudaHead>> parts);
  const HeadSpec& spec() const override { return spec_; }
  int64_t resident_bytes() const override;
  absl::Status CopyOut(HeadTensor tensor, int64_t begin, int64_t count,
                       void* host_out) const override;
  absl::Status GatherRows(const int32_t* ids, int64_t n, DType out_dtype,
                          void* host_out) const override;
  const VocabShards& shards() const { return shards_; }
  const std::shared_ptr<const CudaHead>& part(int s) const { return parts_[s]; }

 private:
  HeadSpec spec_;
  VocabShards shards_;
  std::vector<std::shared_ptr<const CudaHead>> parts_;
};

class ShardedHeadBuilder : public HeadBuilder {
 public:
  ShardedHeadBuilder(HeadSpec spec, VocabShards shards,
                     std::vector<std::unique_ptr<HeadBuilder>> parts);
  absl::Status WriteWeight(int64_t byte_offset, const void* data, int64_t bytes) override;
  absl::Status WriteBias(int64_t byte_offset, const void* data, int64_t bytes) override;
  absl::StatusOr<std::shared_ptr<const Head>> Finish() override;

 private:
  absl::Status Write(bool bias, int64_t byte_offset, const void* data, int64_t bytes);
  HeadSpec spec_;
  VocabShards shards_;
  std::vector<std::unique_ptr<HeadBuilder>> parts_;
};

class ShardedGradBuffer : public GradBuffer {
 public:
  ShardedGradBuffer(HeadSpec spec, VocabShards shards,
                    std::vector<std::unique_ptr<CudaGradBuffer>> parts);
  int64_t vocab_size() const override { return spec_.vocab_size; }
  int64_t hidden_size() const override { return spec_.hidden_size; }
  bool has_bias() const override { return spec_.has_bias; }
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
  const VocabShards& shards() const { return shards_; }
  CudaGradBuffer* part(int s) const { return parts_[s].get(); }

 private:
  // The same-layout sharded buffer, or INVALID_ARGUMENT naming `op`.
  absl::StatusOr<const ShardedGradBuffer*> SameLayout(const GradBuffer& other,
                                                      const char* op) const;
  HeadSpec spec_;
  VocabShards shards_;
  std::vector<std::unique_ptr<CudaGradBuffer>> parts_;
};

// Each shard's state lives with its rows. A step checks every shard before it
// updates any, so a step that is not applied changes nothing anywhere.
class ShardedOptimizer : public HeadOptimizer {
 public:
  ShardedOptimizer(HeadSpec spec, VocabShards shards,
                   std::vector<std::unique_ptr<CudaHeadOptimizer>> parts);
  const OptimizerConfig& config() const override { return parts_[0]->config(); }
  int64_t state_bytes() const override;
  int64_t steps() const override { return parts_[0]->steps(); }
  absl::StatusOr<StepResult> Step(const GradBuffer& grad, const StepParams& params) override;
  absl::Status ReadState(HeadTensor group, OptimizerTensor tensor, int64_t begin, int64_t count,
                         float* host_out) const override;
  absl::Status WriteState(HeadTensor group, OptimizerTensor tensor, int64_t begin, int64_t count,
                          const float* host) override;
  void set_steps(int64_t steps) override;

 private:
  absl::Status ForEachElementPiece(HeadTensor group, int64_t begin, int64_t count,
                                   const VocabShards::PieceFn& fn) const;
  HeadSpec spec_;
  VocabShards shards_;
  std::vector<std::unique_ptr<CudaHeadOptimizer>> parts_;  // null for empty shards
};

}  // namespace flce::cuda

#endif  // FLCE_KERNELS_CUDA_SHARDED_SHARDED_OBJECTS_H_
