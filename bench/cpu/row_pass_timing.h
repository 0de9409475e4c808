// The CPU engine's row pass alone (softmax statistics, loss, dr in place) over
// BT rows of V logits, on the engine's kind of thread pool: what the engine
// adds to the three GEMMs.
#ifndef FLCE_BENCH_CPU_ROW_PASS_TIMING_H_
#define FLCE_BENCH_CPU_ROW_PASS_TIMING_H_

#include <cstdint>

namespace flce::bench {

// Milliseconds for BT rows, processed chunk by chunk as the engine does;
// softcap > 0 caps the logits as LossOptions::softcap does.
double TimeRowPass(int64_t num_tokens, int64_t vocab_size, int64_t chunk_tokens, int threads,
                   float softcap = 0.0f);

}  // namespace flce::bench

#endif  // FLCE_BENCH_CPU_ROW_PASS_TIMING_H_
