// Test data of ../shared/MATH.md: h ~ N(0,1), W ~ N(0, 1/H) (logits ~ N(0,1)),
// a peaked variant (W x 10, targets at the argmax: p_y near 1), a fraction of
// targets set to ignore_index. Values are rounded to the dtypes the engine will
// see, so the float64 reference gets exactly the engine's inputs.
//
// Usage:
//   ProblemSpec ps; ps.vocab_size = 1009; ps.head_dtype = DType::kBF16;
//   Problem problem = MakeProblem(ps);   // fresh seed; problem.seed says which
//   ComputeSpec spec = ...;              // reduction, options, weights, outputs
//   ReferenceOutput ref = ComputeReference(MakeReferenceInput(problem, spec));
#ifndef FLCE_TESTS_SUPPORT_PROBLEM_H_
#define FLCE_TESTS_SUPPORT_PROBLEM_H_

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "kernels/engine.h"
#include "tests/support/reference_f64.h"

namespace flce::test {

struct ProblemSpec {
  int64_t vocab_size = 257;
  int64_t hidden_size = 64;
  int64_t num_tokens = 48;
  DType head_dtype = DType::kF32;
  DType hidden_dtype = DType::kF32;
  bool has_bias = false;
  // Multiplies W ~ N(0, 1/H); 10 gives MATH.md's peaked case.
  double weight_scale = 1.0;
  // Targets of the peaked case: the argmax of the token's logits, so that
  // p_y is near 1 and "p - 1" is where precision is lost.
  bool targets_at_argmax = false;
  double ignore_fraction = 0.05;  // of targets set to ignore_index
  int32_t ignore_index = -100;
  uint64_t seed = 0;  // 0 = a fresh seed
};

struct Problem {
  ProblemSpec spec;
  uint64_t seed = 0;  // the seed actually used: print it on failure
  // Values as the engine holds them (already rounded), as floats.
  std::vector<float> weight;  // V x H, rounded to head_dtype
  std::vector<float> bias;    // V (empty without bias), rounded to head_dtype
  std::vector<float> hidden;  // BT x H, rounded to hidden_dtype
  std::vector<int32_t> targets;
  // The same values as the bytes that travel: head_dtype / hidden_dtype.
  std::string weight_bytes;
  std::string bias_bytes;
  std::string hidden_bytes;
};

Problem MakeProblem(const ProblemSpec& spec);

// A seed no other call in this process got (random_device mixed with a
// counter), so every test sees fresh data.
uint64_t FreshSeed();

// FLCE_TEST_SEED=<decimal seed> in the environment (0 if unset): MakeProblem uses it for
// every problem whose spec leaves the seed at 0, to replay a failure's printed seed.
uint64_t ForcedSeed();

// n values uniform in [lo, hi), as fp32 (the wire's type for a_t and e_t).
std::vector<float> RandomFloats(int64_t n, float lo, float hi, uint64_t seed);

HeadSpec HeadSpecOf(const Problem& problem);

// The reference's input for `spec` (reduction, options, token and entropy
// weights, ignore_index) on `problem`. Hidden is rounded to the head's dtype,
// as the contract says the engine does before its GEMMs.
ReferenceInput MakeReferenceInput(const Problem& problem, const ComputeSpec& spec);

// ||a - b|| / ||b||; +inf if a holds a NaN or an Inf or the sizes differ;
// ||a|| when ||b|| = 0.
double RelativeError(const std::vector<double>& a, const std::vector<double>& b);

std::vector<double> ToDoubles(const std::vector<float>& values);
std::vector<double> ToDoubles(const std::vector<uint8_t>& values);

}  // namespace flce::test

#endif  // FLCE_TESTS_SUPPORT_PROBLEM_H_
