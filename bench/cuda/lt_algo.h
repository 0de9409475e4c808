// cuBLASLt algorithms as the GEMM benchmarks report them.
#ifndef FLCE_BENCH_CUDA_LT_ALGO_H_
#define FLCE_BENCH_CUDA_LT_ALGO_H_

#include <cublasLt.h>

#include <cstdint>

#include "nlohmann/json.hpp"

namespace flce::bench {

// One configuration attribute of an algorithm, read with its own type
// (cuBLASLt refuses a buffer of another size); -1 where it cannot be read.
template <typename T>
int64_t AlgoAttr(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t attr) {
  T value{};
  size_t written = 0;
  if (cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, &value, sizeof(value), &written) !=
      CUBLAS_STATUS_SUCCESS) {
    return -1;
  }
  return static_cast<int64_t>(value);
}

// What an algorithm is, as cuBLASLt's configuration attributes name it.
inline nlohmann::json DescribeAlgo(const cublasLtMatmulAlgo_t& algo) {
  return {{"algo_id", AlgoAttr<int32_t>(algo, CUBLASLT_ALGO_CONFIG_ID)},
          {"tile", AlgoAttr<uint32_t>(algo, CUBLASLT_ALGO_CONFIG_TILE_ID)},
          {"stages", AlgoAttr<uint32_t>(algo, CUBLASLT_ALGO_CONFIG_STAGES_ID)},
          {"splitk", AlgoAttr<int32_t>(algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM)},
          {"reduction", AlgoAttr<uint32_t>(algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME)},
          {"cluster", AlgoAttr<uint16_t>(algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID)},
          {"swizzle", AlgoAttr<uint32_t>(algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING)}};
}

}  // namespace flce::bench

#endif  // FLCE_BENCH_CUDA_LT_ALGO_H_
