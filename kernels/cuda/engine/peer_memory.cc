#include "kernels/cuda/engine/peer_memory.h"

#include <cuda.h>

#include <cctype>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace flce::cuda {
namespace {

// A failed open is the caller's bad handle, not a broken device: the error
// is cleared and reported without touching the engine's health.
absl::Status OpenError(cudaError_t err, const char* what) {
  cudaGetLastError();
  return absl::InvalidArgumentError(
      absl::StrCat(what, ": ", cudaGetErrorName(err), " (", cudaGetErrorString(err), ")"));
}

// The bytes of the allocation from `base` to its end, from the driver (the
// runtime has no such query). -1 when the driver does not say.
int64_t AllocationBytesFrom(const char* base) {
  using GetAddressRange = CUresult (*)(CUdeviceptr*, size_t*, CUdeviceptr);
  static GetAddressRange get = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found;
    if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000, cudaEnableDefault,
                                         &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      return static_cast<GetAddressRange>(nullptr);
    }
    return reinterpret_cast<GetAddressRange>(fn);
  }();
  if (get == nullptr) return -1;
  CUdeviceptr start = 0;
  size_t size = 0;
  if (get(&start, &size, reinterpret_cast<CUdeviceptr>(base)) != CUDA_SUCCESS) return -1;
  return static_cast<int64_t>(start + size) - static_cast<int64_t>(reinterpret_cast<uintptr_t>(base));
}

}  // namespace

std::string CanonicalDeviceUuid(const std::string& uuid) {
  std::string s = uuid;
  if (s.rfind("GPU-", 0) == 0) s = s.substr(4);
  std::string out;
  for (char c : s) {
    if (c == '-') continue;
    out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  return out;
}

absl::StatusOr<std::shared_ptr<const CudaPeerMemory>> CudaPeerMemory::Open(
    std::shared_ptr<DeviceContext> ctx, const PeerMemoryHandle& handle) {
  if (handle.memory_handle.size() != sizeof(cudaIpcMemHandle_t)) {
    return absl::InvalidArgumentError(absl::StrCat("cuda_ipc.memory_handle has ",
                                                   handle.memory_handle.size(), " bytes; a ",
                                                   "cudaIpcMemHandle_t has ",
                                                   sizeof(cudaIpcMemHandle_t)));
  }
  if (handle.event_handle.size() != sizeof(cudaIpcEventHandle_t)) {
    return absl::InvalidArgumentError(absl::StrCat("cuda_ipc.event_handle has ",
                                                   handle.event_handle.size(), " bytes; a ",
                                                   "cudaIpcEventHandle_t has ",
                                                   sizeof(cudaIpcEventHandle_t)));
  }
  if (handle.key.size() != 16) {
    return absl::InvalidArgumentError(
        absl::StrCat("key has ", handle.key.size(), " bytes; it must have 16"));
  }
  if (handle.bytes < 16) {
    return absl::InvalidArgumentError(
        absl::StrCat("bytes = ", handle.bytes, ": a region holds at least its 16-byte key"));
  }
  if (CanonicalDeviceUuid(handle.device_uuid) != CanonicalDeviceUuid(ctx->uuid())) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the memory is on GPU ", handle.device_uuid.empty() ? "(no uuid given)" : handle.device_uuid,
        "; this server computes on ", ctx->uuid(),
        " (reading another GPU's memory needs peer access, which this server does not use): send "
        "hidden by shared memory or messages"));
  }
  FLCE_RETURN_IF_ERROR(ctx->Enter());
  std::shared_ptr<CudaPeerMemory> mem(new CudaPeerMemory(ctx));
  cudaIpcMemHandle_t mh;
  std::memcpy(&mh, handle.memory_handle.data(), sizeof(mh));
  void* base = nullptr;
  if (cudaError_t err = cudaIpcOpenMemHandle(&base, mh, cudaIpcMemLazyEnablePeerAccess);
      err != cudaSuccess) {
    return OpenError(err, "cuda_ipc.memory_handle could not be opened");
  }
  mem->base_ = static_cast<char*>(base);
  const int64_t available = AllocationBytesFrom(mem->base_);
  if (available < 0) {
    return absl::InternalError("the driver did not report the opened allocation's size");
  }
  if (handle.bytes > available) {
    return absl::InvalidArgumentError(absl::StrCat("bytes = ", handle.bytes,
                                                   " but the exported allocation holds ",
                                                   available));
  }
  mem->bytes_ = handle.bytes;
  cudaIpcEventHandle_t eh;
  std::memcpy(&eh, handle.event_handle.data(), sizeof(eh));
  if (cudaError_t err = cudaIpcOpenEventHandle(&mem->ready_, eh); err != cudaSuccess) {
    mem->ready_ = nullptr;
    return OpenError(err, "cuda_ipc.event_handle could not be opened");
  }
  char key[16];
  FLCE_CUDA_RETURN_IF_ERROR(cudaMemcpy(key, mem->base_, sizeof(key), cudaMemcpyDeviceToHost),
                            ctx->health());
  if (std::memcmp(key, handle.key.data(), sizeof(key)) != 0) {
    return absl::PermissionDeniedError(
        "the memory's first 16 bytes are not the key: register memory this client wrote");
  }
  return std::shared_ptr<const CudaPeerMemory>(std::move(mem));
}

absl::StatusOr<std::shared_ptr<const CudaPeerMemory>> CudaPeerMemory::RegisterHost(
    std::shared_ptr<DeviceContext> ctx, void* base, int64_t bytes) {
  FLCE_RETURN_IF_ERROR(ctx->Enter());
  std::shared_ptr<CudaPeerMemory> mem(new CudaPeerMemory(ctx));
  if (cudaError_t err = cudaHostRegister(base, static_cast<size_t>(bytes), cudaHostRegisterDefault);
      err != cudaSuccess) {
    return OpenError(err, "the region could not be page-locked (cudaHostRegister)");
  }
  mem->base_ = static_cast<char*>(base);
  mem->bytes_ = bytes;
  mem->host_ = true;
  return std::shared_ptr<const CudaPeerMemory>(std::move(mem));
}

CudaPeerMemory::~CudaPeerMemory() {
  if (!ctx_->Enter().ok()) return;  // after a sticky error nothing can be closed
  if (ready_ != nullptr) cudaEventDestroy(ready_);
  if (base_ != nullptr && host_) cudaHostUnregister(base_);
  if (base_ != nullptr && !host_) cudaIpcCloseMemHandle(base_);
  cudaGetLastError();
}

}  // namespace flce::cuda
