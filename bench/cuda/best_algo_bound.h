// The three-GEMM bound with the best cuBLASLt algorithm for each product:
// the logits (bf16 out), grad_input (bf16 out) and grad_W (fp32, beta = 1)
// GEMMs of one token chunk, each timed with every algorithm cuBLASLt's
// heuristic offers (up to 32) and run with the fastest. Each chosen
// algorithm's product is checked on sampled entries against float64 sums of
// the inputs it read.
#ifndef FLCE_BENCH_CUDA_BEST_ALGO_BOUND_H_
#define FLCE_BENCH_CUDA_BEST_ALGO_BOUND_H_

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>

#include "nlohmann/json.hpp"

namespace flce::bench {

struct BoundBuffers {
  int64_t rows = 0, hidden = 0, padded_vocab = 0;  // BT, H, Vp
  const void* x = nullptr;                         // BT x H bf16
  const void* w = nullptr;                         // Vp x H bf16
  void* logits = nullptr;                          // chunk x Vp bf16 (also read as dlogits)
  void* grad_input = nullptr;                      // BT x H bf16
  float* grad_weight = nullptr;                    // Vp x H fp32
};

class BestAlgoBound {
 public:
  // Searches the three products at `chunk` tokens (and at the last chunk's
  // size where it differs: the full chunk's algorithm where cuBLASLt accepts
  // it, else the heuristic's first). Null with *why on a failed call or a
  // product outside its check's tolerance. *report: every algorithm's time,
  // the choices and the checks.
  static std::unique_ptr<BestAlgoBound> Search(cublasLtHandle_t lt, cudaStream_t stream,
                                               const BoundBuffers& buffers, int64_t chunk,
                                               nlohmann::json* report, std::string* why);
  ~BestAlgoBound();

  // The whole problem's three GEMMs, chunk by chunk, with the chosen algorithms.
  bool Run(std::string* why);

  struct Product;  // one GEMM's descriptors and chosen algorithm

 private:
  BestAlgoBound() = default;
  cublasLtHandle_t lt_ = nullptr;
  cudaStream_t stream_ = nullptr;
  BoundBuffers b_;
  int64_t chunk_ = 0;
  void* workspace_ = nullptr;
  std::unique_ptr<Product> full_[3];
  std::unique_ptr<Product> tail_[3];  // null when BT is a multiple of chunk
};

}  // namespace flce::bench

#endif  // FLCE_BENCH_CUDA_BEST_ALGO_BOUND_H_
