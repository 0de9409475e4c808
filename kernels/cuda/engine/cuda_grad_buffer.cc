#include "kernels/cuda/engine/cuda_grad_buffer.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "kernels/cuda/base/policy.h"
#include "kernels/cuda/ops/elementwise_kernels.cuh"
#include "kernels/cuda/ops/embedding_kernels.cuh"
#include "kernels/cuda/ops/optimizer_kernels.cuh"

namespace flce::cuda {

absl::StatusOr<std::unique_ptr<CudaGradBuffer>> CudaGradBuffer::Create(
    std::shared_ptr<DeviceContext> ctx, const HeadSpec& spec) {
  if (spec.vocab_size <= 0 || spec.hidden_size <= 0) {
    return absl::InvalidArgumentError("gradient buffer shape must be positive");
  }
  FLCE_RETURN_IF_ERROR(ctx->Enter());
  std::unique_ptr<CudaGradBuffer> g(new CudaGradBuffer());
  g->ctx_ = std::move(ctx);
  g->vocab_ = spec.vocab_size;
  g->hidden_ = spec.hidden_size;
  g->padded_vocab_ = PadVocab(spec.vocab_size);
  g->has_bias_ = spec.has_bias;
  const int64_t floats = g->padded_vocab_ * g->hidden_ + (g->has_bias_ ? g->padded_vocab_ : 0);
  FLCE_ASSIGN_OR_RETURN(DeviceContext::GradMemory memory, g->ctx_->TakeGradMemory(floats * 4));
  g->data_ = std::move(memory.memory);
  if (!memory.zeroed) FLCE_RETURN_IF_ERROR(g->Zero());
  return g;
}

CudaGradBuffer::~CudaGradBuffer() {
  if (ctx_ != nullptr) ctx_->KeepGradMemory(std::move(data_));
}

absl::Status CudaGradBuffer::Zero() { return ctx_->Memset(data_.get(), 0, data_.bytes()); }

absl::StatusOr<const CudaGradBuffer*> CudaGradBuffer::SameShape(const GradBuffer& other,
                                                                const char* op) const {
  const auto* o = dynamic_cast<const CudaGradBuffer*>(&other);
  if (o == nullptr || o->ctx_ != ctx_) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": the other buffer is not from this CUDA engine"));
  }
  if (o->vocab_ != vocab_ || o->hidden_ != hidden_ || o->has_bias_ != has_bias_) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": gradient buffers differ in shape"));
  }
  return o;
}

absl::Status CudaGradBuffer::AddScaled(const GradBuffer& other, float scale) {
  FLCE_ASSIGN_OR_RETURN(const CudaGradBuffer* o, SameShape(other, "AddScaled"));
  return ctx_->Axpy(scale, o->weight(), weight(), data_.bytes() / 4);
}

DeviceContext::Ranges CudaGradBuffer::RealRanges() const {
  DeviceContext::Ranges ranges = {{0, vocab_ * hidden_}};
  if (has_bias_) ranges.emplace_back(padded_vocab_ * hidden_, vocab_);
  return ranges;
}

absl::StatusOr<FiniteCheck> CudaGradBuffer::ScaleAndAdd(float scale, const GradBuffer& base) {
  FLCE_ASSIGN_OR_RETURN(const CudaGradBuffer* o, SameShape(base, "ScaleAndAdd"));
  FLCE_ASSIGN_OR_RETURN(unsigned bad,
                        ctx_->ScaleAddChecked(scale, o->weight(), weight(), RealRanges()));
  return FiniteCheck{(bad & 1u) == 0, (bad & 2u) == 0};
}

absl::Status CudaGradBuffer::ScatterAddRows(const int32_t* ids, int64_t n, const void* rows,
                                            DType dtype, bool deterministic) {
  FLCE_RETURN_IF_ERROR(CheckRowIds(ids, n, vocab_));
  return ctx_->ScatterAddRows(weight(), hidden_, ids, n, rows, dtype, deterministic);
}

absl::StatusOr<GradNorms> CudaGradBuffer::SquaredNorms() const {
  FLCE_ASSIGN_OR_RETURN(std::vector<double> sums, ctx_->SumsOfSquares(weight(), RealRanges()));
  return GradNorms{sums[0], has_bias_ ? sums[1] : 0.0};
}

absl::StatusOr<bool> CudaGradBuffer::AllFinite() const {
  return ctx_->AllFinite(weight(), RealRanges());
}

absl::Status CudaGradBuffer::CopyOut(const float* src, int64_t count, DType out_dtype,
                                     void* host_out) const {
  if (out_dtype == DType::kF32) return ctx_->CopyToHost(host_out, src, count * 4);
  // Through host fp32 in pieces, converted with the exact host conversions.
  constexpr int64_t kPiece = int64_t{1} << 20;
  std::vector<float> tmp(std::min(count, kPiece));
  for (int64_t done = 0; done < count; done += kPiece) {
    const int64_t n = std::min(kPiece, count - done);
    FLCE_RETURN_IF_ERROR(ctx_->CopyToHost(tmp.data(), src + done, n * 4));
    FromFloat(out_dtype, tmp.data(), static_cast<char*>(host_out) + done * DTypeSize(out_dtype), n);
  }
  return absl::OkStatus();
}

absl::Status CudaGradBuffer::CopyWeightRows(int64_t row_begin, int64_t rows, DType out_dtype,
                                            void* host_out) const {
  if (row_begin < 0 || rows < 0 || row_begin + rows > vocab_) {
    return absl::OutOfRangeError(absl::StrCat("gradient rows [", row_begin, ", ", row_begin + rows,
                                              ") outside [0, ", vocab_, ")"));
  }
  return CopyOut(weight() + row_begin * hidden_, rows * hidden_, out_dtype, host_out);
}

absl::Status CudaGradBuffer::CopyBias(int64_t begin, int64_t count, DType out_dtype,
                                      void* host_out) const {
  if (!has_bias_) return absl::FailedPreconditionError("gradient buffer has no bias");
  if (begin < 0 || count < 0 || begin + count > vocab_) {
    return absl::OutOfRangeError(
        absl::StrCat("bias gradient [", begin, ", ", begin + count, ") outside [0, ", vocab_, ")"));
  }
  return CopyOut(bias() + begin, count, out_dtype, host_out);
}

}  // namespace flce::cuda
