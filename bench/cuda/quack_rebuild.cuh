// A cuBLAS rebuild of QuACK v0.6.1's chunked linear cross-entropy
// (Dao-AILab/quack, quack/linear_cross_entropy.py,
// chunked_linear_cross_entropy_fwd), the pipeline the engine is measured
// against: per chunk of 4096 tokens, bf16 logits from cuBLAS, one row kernel
// that writes the token's loss and rewrites its logits row as dlogits in
// place, dX = dlogits W (bf16), and dW = dlogits^T x into fp32 (beta = 0 for
// the first chunk, 1 after). A rebuild with cuBLAS GEMMs, not QuACK's CuTe
// kernels: named so wherever it is reported.
#ifndef FLCE_BENCH_CUDA_QUACK_REBUILD_CUH_
#define FLCE_BENCH_CUDA_QUACK_REBUILD_CUH_

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "nlohmann/json.hpp"

namespace flce::bench {

struct QuackRebuildArgs {
  int64_t rows = 0;                 // BT
  int64_t hidden = 0;               // H
  int64_t vocab = 0;                // V
  int64_t padded_vocab = 0;         // W's rows (padding rows zero), a multiple of 8
  int64_t chunk = 4096;             // QuACK's default chunk_size
  const void* x = nullptr;          // BT x H bf16
  const void* w = nullptr;          // Vp x H bf16
  const int32_t* target = nullptr;  // BT; < 0 = ignored
  float grad_scale = 1.0f;          // 1 / valid tokens: the mean's factor, in dlogits
  void* logits = nullptr;           // chunk x Vp bf16 scratch (dlogits in place)
  float* loss = nullptr;            // BT: lse - z_y, 0 for ignored tokens
  void* grad_input = nullptr;       // BT x H bf16
  float* grad_weight = nullptr;     // Vp x H fp32, overwritten
};

// One fwd+bwd over the whole problem on `stream` (the handle's stream).
// False, with the failing call in *why, when a CUDA or cuBLAS call fails.
bool RunQuackRebuild(cublasHandle_t cublas, const QuackRebuildArgs& args, cudaStream_t stream,
                     std::string* why);

// The rebuild on a small problem of two chunks (the second partial, so that
// beta = 1 is exercised) against a float64 reference computed here from the
// same bf16 inputs, outputs poisoned with NaN first: relative errors of the
// loss sum, grad_input and grad_W, and whether they are within bf16 logits'
// and dlogits' rounding (ok). The caller reports it beside the timings.
nlohmann::json ValidateQuackRebuild(cublasHandle_t cublas, cudaStream_t stream);

}  // namespace flce::bench

#endif  // FLCE_BENCH_CUDA_QUACK_REBUILD_CUH_
