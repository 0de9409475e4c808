// Comparing an engine's run with the float64 reference under MATH.md's
// tolerances.
#ifndef FLCE_TESTS_ENGINE_CONFORMANCE_CHECKS_H_
#define FLCE_TESTS_ENGINE_CONFORMANCE_CHECKS_H_

#include <string>

#include "kernels/engine.h"
#include "tests/support/engine_harness.h"
#include "tests/support/reference_f64.h"

namespace flce::test {

struct Tolerance {
  double grad = 1e-5;        // grad_input, grad_W, grad_b (relative norm)
  double grad_input = 1e-5;  // grad_input as returned in hidden_dtype
  double loss = 1e-5;        // loss, z_loss, entropy_sum, per-token outputs
  int64_t argmax_mismatches = 0;  // tokens whose `correct` may differ
};

// MATH.md: CPU fp32 math -> 1e-5 for everything. grad_input travels back in
// hidden_dtype, so a 16-bit hidden adds that type's rounding (bf16 2^-8,
// fp16 2^-11). GPU: 16-bit inputs 5e-3 for grads and 1e-4 for the loss and
// per-token outputs; fp32 inputs (TF32 allowed) 2e-3.
Tolerance ToleranceFor(const std::string& engine, DType head_dtype, DType hidden_dtype,
                       int64_t num_tokens);

// Checks every output of `run` the spec asked for against `ref`.
void ExpectMatchesReference(const EngineRun& run, const ReferenceOutput& ref,
                            const ComputeSpec& spec, const Tolerance& tol);

}  // namespace flce::test

#endif  // FLCE_TESTS_ENGINE_CONFORMANCE_CHECKS_H_
