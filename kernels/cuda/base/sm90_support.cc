#include "kernels/cuda/base/sm90_support.h"

#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <map>
#include <mutex>

#include "absl/strings/str_cat.h"

namespace flce::cuda::sm90 {
namespace {

PFN_cuTensorMapEncodeTiled_v12000 EncodeFunction() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault,
                                         &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      return static_cast<PFN_cuTensorMapEncodeTiled_v12000>(nullptr);
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}

CUtensorMapDataType MapType(DType dtype) {
  switch (dtype) {
    case DType::kF16:
      return CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
    case DType::kBF16:
      return CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
    case DType::kF32:
      break;
  }
  return CU_TENSOR_MAP_DATA_TYPE_FLOAT32;
}

// Per device ordinal: a process may drive several GPUs (a head split across
// them), which need not be alike.
template <typename Value, typename Query>
Value PerDevice(std::map<int, Value>* cache, std::mutex* mu, Value fallback, Query query) {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return fallback;
  std::lock_guard<std::mutex> lock(*mu);
  auto it = cache->find(device);
  if (it != cache->end()) return it->second;
  const Value v = query(device);
  cache->emplace(device, v);
  return v;
}

}  // namespace

absl::Status EncodeTensorMap(CUtensorMap* map, DType dtype, const void* base,
                             const TensorMapShape& shape) {
  PFN_cuTensorMapEncodeTiled_v12000 encode = EncodeFunction();
  if (encode == nullptr) return absl::InternalError("cuTensorMapEncodeTiled is unavailable");
  cuuint64_t dims[3];
  cuuint64_t strides[2];
  cuuint32_t box[3];
  const cuuint32_t element_strides[3] = {1, 1, 1};
  for (int i = 0; i < shape.rank; ++i) {
    dims[i] = shape.dims[i];
    box[i] = shape.box[i];
    if (i + 1 < shape.rank) strides[i] = shape.row_bytes[i];
  }
  const CUresult r = encode(map, MapType(dtype), static_cast<cuuint32_t>(shape.rank),
                            const_cast<void*>(base), dims, strides, box, element_strides,
                            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    return absl::InternalError(
        absl::StrCat("cuTensorMapEncodeTiled failed (CUresult ", r, ") for a rank-", shape.rank,
                     " tensor of ", shape.dims[0], " x ", shape.dims[1], " x ", shape.dims[2]));
  }
  return absl::OkStatus();
}

absl::Status EncodeMatrix(CUtensorMap* map, DType dtype, const void* base, int64_t rows,
                          int64_t cols, uint32_t box_cols, uint32_t box_rows) {
  TensorMapShape shape;
  shape.rank = 2;
  shape.dims[0] = static_cast<uint64_t>(cols);
  shape.dims[1] = static_cast<uint64_t>(rows);
  shape.row_bytes[0] = static_cast<uint64_t>(cols) * DTypeSize(dtype);
  shape.box[0] = box_cols;
  shape.box[1] = box_rows;
  return EncodeTensorMap(map, dtype, base, shape);
}

int SmCount() {
  static std::mutex mu;
  static std::map<int, int> cache;
  return PerDevice<int>(&cache, &mu, 0, [](int device) {
    int n = 0;
    if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) return 0;
    return n;
  });
}

bool HeadFitsHopperKernels(DType dtype, int64_t hidden) {
  if (dtype != DType::kBF16 && dtype != DType::kF16) return false;
  if (hidden <= 0 || hidden % 8 != 0) return false;
  return DeviceIsSm90();
}

bool DeviceIsSm90() {
  static std::mutex mu;
  static std::map<int, bool> cache;
  return PerDevice<bool>(&cache, &mu, false, [](int device) {
    int major = 0, minor = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
      return false;
    }
    return major == 9 && minor == 0 && EncodeFunction() != nullptr;
  });
}

PersistentLaunch::PersistentLaunch(int64_t units, int cluster, int threads, size_t shared_bytes,
                                   cudaStream_t stream) {
  const int64_t slots = std::max(SmCount() / cluster, 1);
  config_.gridDim = dim3(static_cast<unsigned>(std::min(units, slots) * cluster));
  config_.blockDim = dim3(static_cast<unsigned>(threads));
  config_.dynamicSmemBytes = shared_bytes;
  config_.stream = stream;
  if (cluster > 1) {
    cudaLaunchAttribute& a = attrs_[num_attrs_++];
    a.id = cudaLaunchAttributeClusterDimension;
    a.val.clusterDim.x = static_cast<unsigned>(cluster);
    a.val.clusterDim.y = 1;
    a.val.clusterDim.z = 1;
  }
}

void PersistentLaunch::StartBesidePrevious() {
  cudaLaunchAttribute& a = attrs_[num_attrs_++];
  a.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  a.val.programmaticStreamSerializationAllowed = 1;
}

const cudaLaunchConfig_t* PersistentLaunch::config() {
  config_.attrs = attrs_;
  config_.numAttrs = static_cast<unsigned>(num_attrs_);
  return &config_;
}

}  // namespace flce::cuda::sm90
