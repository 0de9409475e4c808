// What the stand-alone CUDA bench programs share: a CUDA call that fails ends
// the program with the call and the error, and the median of timings.
#ifndef FLCE_BENCH_CUDA_BENCH_CHECK_H_
#define FLCE_BENCH_CUDA_BENCH_CHECK_H_

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CHECK_CUDA(expr)                                                                          \
  do {                                                                                            \
    cudaError_t e_ = (expr);                                                                      \
    if (e_ != cudaSuccess) {                                                                      \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(e_)); \
      std::exit(1);                                                                               \
    }                                                                                             \
  } while (0)

namespace flce::bench {

// The middle value, or the mean of the two middle ones.
inline double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

}  // namespace flce::bench

#endif  // FLCE_BENCH_CUDA_BENCH_CHECK_H_
