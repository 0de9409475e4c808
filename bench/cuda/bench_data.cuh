// Device-side generation of MATH.md's random benchmark data (h ~ N(0,1),
// W ~ N(0, 1/H), 5% of targets ignored) straight into device memory, so
// that gigabytes of inputs need no host round trip.
#ifndef FLCE_BENCH_CUDA_BENCH_DATA_CUH_
#define FLCE_BENCH_CUDA_BENCH_DATA_CUH_

#include <cuda_runtime.h>

#include <cstdint>

namespace flce::bench {

// count bf16 values N(0, stddev^2) from a counter-based hash of (seed, i).
cudaError_t FillNormalBf16(void* dst, int64_t count, float stddev, uint64_t seed,
                           cudaStream_t stream);
// Targets uniform in [0, vocab), a fraction `ignored` set to -1 (the engine's
// ignored marker); token weights 1/n_valid is computed by the caller.
cudaError_t FillNormalF32(float* dst, int64_t count, float stddev, uint64_t seed,
                          cudaStream_t stream);
cudaError_t FillTargets(int32_t* dst, int64_t count, int64_t vocab, float ignored, uint64_t seed,
                        cudaStream_t stream);
cudaError_t FillConstant(float* dst, int64_t count, float value, cudaStream_t stream);
// token_weight[t] = target[t] >= 0 ? value : 0
cudaError_t FillTokenWeights(float* dst, const int32_t* target, int64_t count, float value,
                             cudaStream_t stream);

}  // namespace flce::bench

#endif  // FLCE_BENCH_CUDA_BENCH_DATA_CUH_
