#include "kernels/cuda/engine/device_objects.h"

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

constexpr int64_t kStagingBytes = int64_t{16} << 20;
// A gradient buffer's real ranges: the weight and the bias.
constexpr size_t kMaxSumRanges = 2;

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

std::string FormatDeviceUuid(const cudaUUID_t& uuid) {
  static const char kHex[] = "0123456789abcdef";
  std::string out = "GPU-";
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out += '-';
    const auto byte = static_cast<unsigned char>(uuid.bytes[i]);
    out += kHex[byte >> 4];
    out += kHex[byte & 15];
  }
  return out;
}

}  // namespace

absl::StatusOr<std::shared_ptr<DeviceContext>> DeviceContext::Create(int ordinal) {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    cudaGetLastError();
    return absl::UnavailableError(absl::StrCat(
        "no CUDA device available: ",
        err != cudaSuccess ? cudaGetErrorString(err) : "cudaGetDeviceCount returned 0"));
  }
  if (ordinal < 0 || ordinal >= count) {
    return absl::UnavailableError(
        absl::StrCat("CUDA device ", ordinal, " requested; ", count, " present"));
  }
  std::shared_ptr<DeviceContext> ctx(new DeviceContext());
  ctx->ordinal_ = ordinal;
  FLCE_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal), &ctx->health_);
  cudaDeviceProp prop;
  FLCE_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, ordinal), &ctx->health_);
  ctx->name_ = prop.name;
  ctx->uuid_ = FormatDeviceUuid(prop.uuid);
  FLCE_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&ctx->aux_, cudaStreamNonBlocking),
                            &ctx->health_);
  FLCE_ASSIGN_OR_RETURN(ctx->staging_, PinnedBuffer::Allocate(kStagingBytes, &ctx->health_));
  FLCE_ASSIGN_OR_RETURN(ctx->flags_, DeviceBuffer::Allocate(sizeof(unsigned), &ctx->health_));
  FLCE_ASSIGN_OR_RETURN(
      ctx->sums_, DeviceBuffer::Allocate((kSumOfSquaresBlocks + kMaxSumRanges) * sizeof(double),
                                         &ctx->health_));
  FLCE_ASSIGN_OR_RETURN(ctx->scratch_, DeviceBuffer::Allocate(kStagingBytes, &ctx->health_));
  DeviceContext* raw = ctx.get();
  RegisterReclaimer(raw, [raw] {
    std::lock_guard<std::mutex> lock(raw->spare_mu_);
    const bool any = !raw->spare_grads_.empty();
    raw->spare_grads_.clear();
    return any;
  });
  return ctx;
}

absl::StatusOr<DeviceContext::GradMemory> DeviceContext::TakeGradMemory(int64_t bytes) {
  GradMemory found;
  {
    std::lock_guard<std::mutex> lock(spare_mu_);
    for (auto it = spare_grads_.begin(); it != spare_grads_.end(); ++it) {
      if (it->memory.bytes() == bytes) {
        found = std::move(*it);
        spare_grads_.erase(it);
        break;
      }
    }
  }
  if (found.memory.get() == nullptr) {
    FLCE_ASSIGN_OR_RETURN(found.memory, DeviceBuffer::Allocate(bytes, &health_));
    return found;  // not zeroed
  }
  if (found.zeroed) {
    // Its memset was queued on the auxiliary stream when it was kept.
    FLCE_RETURN_IF_ERROR(Enter());
    std::lock_guard<std::mutex> lock(aux_mu_);
    FLCE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(aux_), &health_);
  }
  return found;
}

void DeviceContext::KeepGradMemory(DeviceBuffer memory) {
  if (memory.get() == nullptr || !health_.healthy.load()) return;
  GradMemory spare{std::move(memory), false};
  if (Enter().ok()) {
    std::lock_guard<std::mutex> lock(aux_mu_);
    spare.zeroed = cudaMemsetAsync(spare.memory.get(), 0, spare.memory.bytes(), aux_) == cudaSuccess;
    if (!spare.zeroed) cudaGetLastError();  // not sticky: the memory is zeroed when taken
  }
  std::lock_guard<std::mutex> lock(spare_mu_);
  if (static_cast<int>(spare_grads_.size()) == kSpareGradBuffers) {
    spare_grads_.erase(spare_grads_.begin());  // the oldest goes back to the driver
  }
  spare_grads_.push_back(std::move(spare));
}

int DeviceContext::spare_grad_buffers() const {
  std::lock_guard<std::mutex> lock(spare_mu_);
  return static_cast<int>(spare_grads_.size());
}

DeviceContext::~DeviceContext() {
  UnregisterReclaimer(this);
  spare_grads_.clear();
  staging_.Reset();
  if (aux_ != nullptr) cudaStreamDestroy(aux_);
}

absl::Status DeviceContext::Enter() {
  FLCE_RETURN_IF_ERROR(health_.Check());
  FLCE_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_), &health_);
  return absl::OkStatus();
}

absl::Status DeviceContext::CopyToDevice(void* dst, const void* src, int64_t bytes) {
  FLCE_RETURN_IF_ERROR(Enter());
  std::lock_guard<std::mutex> lock(aux_mu_);
  for (int64_t done = 0; done < bytes; done += kStagingBytes) {
    const int64_t n = std::min(kStagingBytes, bytes - done);
    std::memcpy(staging_.get(), static_cast<const char*>(src) + done, n);
    FLCE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(static_cast<char*>(dst) + done, staging_.get(), n,
                                              cudaMemcpyHostToDevice, aux_),
                              &health_);
    // The staging buffer is reused by the next piece.
    FLCE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(aux_), &health_);
  }
  return absl::OkStatus();
}

absl::Status DeviceContext::CopyToHost(void* dst, const void* src, int64_t bytes,
                                       cudaEvent_t after) {
  FLCE_RETURN_IF_ERROR(Enter());
  std::lock_guard<std::mutex> lock(aux_mu_);
  if (after != nullptr) FLCE_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(aux_, after, 0), &health_);
  for (int64_t done = 0; done < bytes; done += kStagingBytes) {
    const int64_t n = std::min(kStagingBytes, bytes - done);
    FLCE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(staging_.get(), static_cast<const char*>(src) + done,
                                              n, cudaMemcpyDeviceToHost, aux_),
                              &health_);
    FLCE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(aux_), &health_);
    std::memcpy(static_cast<char*>(dst) + done, staging_.get(), n);
  }
  return absl::OkStatus();
}

absl::Status DeviceContext::Memset(void* dst, int value, int64_t bytes) {
  FLCE_RETURN_IF_ERROR(Enter());
  std::lock_guard<std::mutex> lock(aux_mu_);
  FLCE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(dst, value, bytes, aux_), &health_);
  FLCE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(aux_), &health_);
  return absl::OkStatus();
}

absl::Status DeviceContext::Axpy(float alpha, const float* x, float* y, int64_t count) {
  FLCE_RETURN_IF_ERROR(Enter());
  std::lock_guard<std::mutex> lock(aux_mu_);
  FLCE_RETURN_IF_ERROR(LaunchAxpy(alpha, x, y, count, aux_, &health_));
  FLCE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(aux_), &health_);
  return absl::OkStatus();
}

absl::StatusOr<unsigned> DeviceContext::ScaleAddChecked(float scale, const float* base,
                                                        float* inout, const Ranges& ranges) {
  FLCE_RETURN_IF_ERROR(Enter());
  std::lock_guard<std::mutex> lock(aux_mu_);
  auto* flags = static_cast<unsigned*>(flags_.get());
  FLCE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(flags, 0, sizeof(unsigned), aux_), &health_);
  for (const auto& [offset, count] : ranges) {
    FLCE_RETURN_IF_ERROR(
        LaunchScaleAddChecked(scale, base + offset, inout + offset, count, flags, aux_, &health_));
  }
  return ReadFlagsLocked();
}

absl::StatusOr<bool> DeviceContext::AllFinite(const float* x, const Ranges& ranges) {
  FLCE_RETURN_IF_ERROR(Enter());
  std::lock_guard<std::mutex> lock(aux_mu_);
  auto* flags = static_cast<unsigned*>(flags_.get());
  FLCE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(flags, 0, sizeof(unsigned), aux_), &health_);
  for (const auto& [offset, count] : ranges) {
    FLCE_RETURN_IF_ERROR(LaunchCheckFinite(x + offset, count, flags, aux_, &health_));
  }
  FLCE_ASSIGN_OR_RETURN(unsigned bad, ReadFlagsLocked());
  return bad == 0;
}

absl::StatusOr<std::vector<double>> DeviceContext::SumsOfSquares(const float* x,
                                                                 const Ranges& ranges) {
  if (ranges.size() > kMaxSumRanges) return absl::InternalError("SumsOfSquares: too many ranges");
  FLCE_RETURN_IF_ERROR(Enter());
  std::lock_guard<std::mutex> lock(aux_mu_);
  auto* partials = static_cast<double*>(sums_.get());
  double* results = partials + kSumOfSquaresBlocks;
  for (size_t r = 0; r < ranges.size(); ++r) {
    const auto& [offset, count] = ranges[r];
    FLCE_RETURN_IF_ERROR(
        LaunchSumOfSquares(x + offset, count, partials, results + r, aux_, &health_));
  }
  const int64_t bytes = static_cast<int64_t>(ranges.size() * sizeof(double));
  FLCE_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(staging_.get(), results, bytes, cudaMemcpyDeviceToHost, aux_), &health_);
  FLCE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(aux_), &health_);
  std::vector<double> out(ranges.size());
  std::memcpy(out.data(), staging_.get(), bytes);
  return out;
}

namespace {

// Rows per piece when each row takes row_bytes (and its 4-byte id) of a
// kStagingBytes buffer; INVALID_ARGUMENT when not even one fits.
absl::StatusOr<int64_t> RowsPerPiece(int64_t row_bytes) {
  const int64_t rows = kStagingBytes / (row_bytes + static_cast<int64_t>(sizeof(int32_t)));
  if (rows < 1) return absl::InvalidArgumentError("a row is larger than the staging buffer");
  return rows;
}

}  // namespace

absl::Status DeviceContext::GatherRows(const void* weight, DType weight_dtype, int64_t hidden,
                                       const int32_t* ids, int64_t n, DType out_dtype,
                                       void* host_out) {
  const int64_t row_bytes = hidden * DTypeSize(out_dtype);
  FLCE_ASSIGN_OR_RETURN(const int64_t piece, RowsPerPiece(row_bytes));
  FLCE_RETURN_IF_ERROR(Enter());
  std::lock_guard<std::mutex> lock(aux_mu_);
  auto* dev_ids = static_cast<int32_t*>(scratch_.get());
  char* dev_rows = static_cast<char*>(scratch_.get()) + piece * sizeof(int32_t);
  for (int64_t done = 0; done < n; done += piece) {
    const int64_t rows = std::min(piece, n - done);
    std::memcpy(staging_.get(), ids + done, rows * sizeof(int32_t));
    FLCE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dev_ids, staging_.get(), rows * sizeof(int32_t),
                                              cudaMemcpyHostToDevice, aux_),
                              &health_);
    FLCE_RETURN_IF_ERROR(LaunchGatherRows(weight, weight_dtype, hidden, dev_ids, rows, dev_rows,
                                          out_dtype, aux_, &health_));
    FLCE_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(staging_.get(), dev_rows, rows * row_bytes, cudaMemcpyDeviceToHost, aux_),
        &health_);
    FLCE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(aux_), &health_);
    std::memcpy(static_cast<char*>(host_out) + done * row_bytes, staging_.get(), rows * row_bytes);
  }
  return absl::OkStatus();
}

absl::Status DeviceContext::ScatterAddRows(float* grad, int64_t hidden, const int32_t* ids,
                                           int64_t n, const void* host_rows, DType rows_dtype,
                                           bool deterministic) {
  const int64_t row_bytes = hidden * DTypeSize(rows_dtype);
  FLCE_ASSIGN_OR_RETURN(const int64_t piece, RowsPerPiece(row_bytes));
  FLCE_RETURN_IF_ERROR(Enter());
  std::lock_guard<std::mutex> lock(aux_mu_);
  auto* dev_ids = static_cast<int32_t*>(scratch_.get());
  char* dev_rows = static_cast<char*>(scratch_.get()) + piece * sizeof(int32_t);
  char* staged_rows = static_cast<char*>(staging_.get()) + piece * sizeof(int32_t);
  for (int64_t done = 0; done < n; done += piece) {
    const int64_t rows = std::min(piece, n - done);
    // One staging layout for both: ids, then rows, copied in one transfer.
    std::memcpy(staging_.get(), ids + done, rows * sizeof(int32_t));
    std::memcpy(staged_rows, static_cast<const char*>(host_rows) + done * row_bytes,
                rows * row_bytes);
    FLCE_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(scratch_.get(), staging_.get(), piece * sizeof(int32_t) + rows * row_bytes,
                        cudaMemcpyHostToDevice, aux_),
        &health_);
    FLCE_RETURN_IF_ERROR(LaunchScatterAddRows(grad, hidden, dev_ids, rows, dev_rows, rows_dtype,
                                              deterministic, aux_, &health_));
    // The staging buffer is rewritten by the next piece: wait for this one.
    FLCE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(aux_), &health_);
  }
  return absl::OkStatus();
}

absl::StatusOr<unsigned> DeviceContext::RunFlagged(const FlaggedLaunch& launch) {
  FLCE_RETURN_IF_ERROR(Enter());
  std::lock_guard<std::mutex> lock(aux_mu_);
  auto* flags = static_cast<unsigned*>(flags_.get());
  FLCE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(flags, 0, sizeof(unsigned), aux_), &health_);
  FLCE_RETURN_IF_ERROR(launch(aux_, flags));
  return ReadFlagsLocked();
}

absl::StatusOr<unsigned> DeviceContext::ReadFlagsLocked() {
  FLCE_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(staging_.get(), flags_.get(), sizeof(unsigned), cudaMemcpyDeviceToHost, aux_),
      &health_);
  FLCE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(aux_), &health_);
  unsigned out;
  std::memcpy(&out, staging_.get(), sizeof(out));
  return out;
}

// ------------------------------------------------------------------ heads --

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

// --------------------------------------------------------- grad buffers --

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
