// OpenBLAS alone on the CPU engine's three GEMM shapes, token chunk by token
// chunk (6 BT V H flops, nothing else): the rate the engine is compared with.
#ifndef FLCE_BENCH_CPU_GEMM_BOUND_H_
#define FLCE_BENCH_CPU_GEMM_BOUND_H_

#include <cstdint>

namespace flce::bench {

struct GemmTimes {
  double logits_ms = 0.0;      // X W^T       (chunk x V x H) per chunk, summed
  double grad_input_ms = 0.0;  // dlogits W   (chunk x H x V)
  double grad_weight_ms = 0.0; // dlogits^T X (V x H x chunk), beta = 1
  double total_ms() const { return logits_ms + grad_input_ms + grad_weight_ms; }
};

// One timed pass over all chunks of a BT-token problem.
GemmTimes TimeThreeGemms(int64_t num_tokens, int64_t vocab_size, int64_t hidden_size,
                         int64_t chunk_tokens);

}  // namespace flce::bench

#endif  // FLCE_BENCH_CPU_GEMM_BOUND_H_
