#include "kernels/cuda/engine/cuda_head.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "kernels/cuda/base/policy.h"
#include "kernels/cuda/ops/elementwise_kernels.cuh"
#include "kernels/cuda/ops/embedding_kernels.cuh"
#include "kernels/cuda/ops/optimizer_kernels.cuh"

namespace flce::cuda {
namespace {

// FAILED_PRECONDITION naming the first byte not covered by `written`.
absl::Status CheckCovered(std::vector<std::pair<int64_t, int64_t>> written, int64_t total,
                          const char* what) {
  std::sort(written.begin(), written.end());
  int64_t covered = 0;
  for (const auto& [begin, end] : written) {
    if (begin > covered) break;
    covered = std::max(covered, end);
  }
  if (covered < total) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, " incomplete: byte ", covered, " of ", total, " was never written"));
  }
  return absl::OkStatus();
}

}  // namespace

CudaHead::CudaHead(std::shared_ptr<DeviceContext> ctx, HeadSpec spec, DeviceBuffer weight,
                   DeviceBuffer bias)
    : ctx_(std::move(ctx)),
      spec_(spec),
      padded_vocab_(PadVocab(spec.vocab_size)),
      weight_(std::move(weight)),
      bias_(std::move(bias)) {}

absl::Status CudaHead::CopyOut(HeadTensor tensor, int64_t begin, int64_t count,
                               void* host_out) const {
  const bool weight = tensor == HeadTensor::kWeight;
  FLCE_RETURN_IF_ERROR(CheckElementRange(
      HeadTensorName(tensor), begin, count,
      weight ? spec_.vocab_size * spec_.hidden_size : (spec_.has_bias ? spec_.vocab_size : 0)));
  const int64_t size = DTypeSize(spec_.dtype);
  const char* src = static_cast<const char*>(weight ? weight_.get() : bias_.get());
  return ctx_->CopyToHost(host_out, src + begin * size, count * size);
}

absl::Status CudaHead::GatherRows(const int32_t* ids, int64_t n, DType out_dtype,
                                  void* host_out) const {
  FLCE_RETURN_IF_ERROR(CheckRowIds(ids, n, spec_.vocab_size));
  if (out_dtype != DType::kF32 && out_dtype != spec_.dtype) {
    return absl::InvalidArgumentError(absl::StrCat("rows are gathered as ", DTypeName(spec_.dtype),
                                                   " or fp32, not ", DTypeName(out_dtype)));
  }
  return ctx_->GatherRows(weight_.get(), spec_.dtype, spec_.hidden_size, ids, n, out_dtype,
                          host_out);
}

HeadView CudaHead::view() const {
  HeadView v;
  v.dtype = spec_.dtype;
  v.vocab = spec_.vocab_size;
  v.padded_vocab = padded_vocab_;
  v.hidden = spec_.hidden_size;
  v.weight = weight_.get();
  v.bias = spec_.has_bias ? bias_.get() : nullptr;
  return v;
}

absl::StatusOr<std::unique_ptr<CudaHeadBuilder>> CudaHeadBuilder::Create(
    std::shared_ptr<DeviceContext> ctx, const HeadSpec& spec) {
  if (spec.vocab_size <= 0 || spec.hidden_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("head shape ", spec.vocab_size, " x ", spec.hidden_size, " must be positive"));
  }
  if (spec.vocab_size >= (int64_t{1} << 31) - VocabPolicy::kAlign) {
    return absl::InvalidArgumentError("vocab_size too large for the CUDA engine");
  }
  FLCE_RETURN_IF_ERROR(ctx->Enter());
  std::unique_ptr<CudaHeadBuilder> b(new CudaHeadBuilder());
  b->ctx_ = ctx;
  b->spec_ = spec;
  const int64_t vp = PadVocab(spec.vocab_size);
  const int64_t es = DTypeSize(spec.dtype);
  FLCE_ASSIGN_OR_RETURN(b->weight_,
                        DeviceBuffer::Allocate(vp * spec.hidden_size * es, ctx->health()));
  // Padded rows must be zero: their logits are then exactly the bias (0).
  FLCE_RETURN_IF_ERROR(ctx->Memset(b->weight_.get(), 0, b->weight_.bytes()));
  if (spec.has_bias) {
    FLCE_ASSIGN_OR_RETURN(b->bias_, DeviceBuffer::Allocate(vp * es, ctx->health()));
    FLCE_RETURN_IF_ERROR(ctx->Memset(b->bias_.get(), 0, b->bias_.bytes()));
  }
  return b;
}

absl::Status CudaHeadBuilder::Write(bool bias, int64_t byte_offset, const void* data,
                                    int64_t bytes) {
  if (finished_) return absl::FailedPreconditionError("head builder already finished");
  if (bias && !spec_.has_bias) return absl::InvalidArgumentError("head has no bias");
  const int64_t es = DTypeSize(spec_.dtype);
  const int64_t total = bias ? spec_.vocab_size * es : spec_.vocab_size * spec_.hidden_size * es;
  if (byte_offset < 0 || bytes < 0 || byte_offset + bytes > total) {
    return absl::InvalidArgumentError(absl::StrCat(bias ? "bias" : "weight", " bytes [",
                                                   byte_offset, ", ", byte_offset + bytes,
                                                   ") outside [0, ", total, ")"));
  }
  if (bytes == 0) return absl::OkStatus();
  char* dst = static_cast<char*>(bias ? bias_.get() : weight_.get()) + byte_offset;
  FLCE_RETURN_IF_ERROR(ctx_->CopyToDevice(dst, data, bytes));
  (bias ? bias_written_ : weight_written_).emplace_back(byte_offset, byte_offset + bytes);
  return absl::OkStatus();
}

absl::Status CudaHeadBuilder::WriteWeight(int64_t byte_offset, const void* data, int64_t bytes) {
  return Write(false, byte_offset, data, bytes);
}

absl::Status CudaHeadBuilder::WriteBias(int64_t byte_offset, const void* data, int64_t bytes) {
  return Write(true, byte_offset, data, bytes);
}

absl::StatusOr<std::shared_ptr<const Head>> CudaHeadBuilder::Finish() {
  if (finished_) return absl::FailedPreconditionError("head builder already finished");
  const int64_t es = DTypeSize(spec_.dtype);
  FLCE_RETURN_IF_ERROR(
      CheckCovered(weight_written_, spec_.vocab_size * spec_.hidden_size * es, "head weight"));
  if (spec_.has_bias) {
    FLCE_RETURN_IF_ERROR(CheckCovered(bias_written_, spec_.vocab_size * es, "head bias"));
  }
  finished_ = true;
  return std::shared_ptr<const Head>(
      std::make_shared<CudaHead>(ctx_, spec_, std::move(weight_), std::move(bias_)));
}

}  // namespace flce::cuda
