#include "kernels/cuda/engine/device_context.h"

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

}  // namespace flce::cuda
