// Runs a test Problem through any flce::Engine the way the server does, and
// checks the engine's side of the protocol while doing so: the head streams in
// over several HeadBuilder writes, hidden goes in as row blocks in a shuffled
// order, every grad_input row must reach the sink exactly once, and every
// output lands in a NaN-poisoned buffer so that an element never written
// cannot pass as a value.
//
// Usage:
//   auto engine = *CreateCpuEngine({});
//   Problem problem = MakeProblem(ps);
//   ComputeSpec spec;  spec.reduction = Reduction::kSum;  ...
//   absl::StatusOr<EngineRun> run = RunProblem(*engine, problem, spec, {});
//   // run->result, run->grad_input, run->grad_weight, run->grad_bias (doubles)
#ifndef FLCE_TESTS_SUPPORT_ENGINE_HARNESS_H_
#define FLCE_TESTS_SUPPORT_ENGINE_HARNESS_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/engine.h"
#include "tests/support/problem.h"

namespace flce::test {

struct HarnessOptions {
  int weight_chunks = 3;        // HeadBuilder::WriteWeight calls (uneven sizes)
  int64_t rows_per_block = 5;   // AddHidden block size; <= 0 = all rows at once
  bool shuffle_blocks = true;   // submit blocks in a random order
  bool with_grad_buffer = true; // allocate a GradBuffer for grad_W / grad_b
  DType grad_read_dtype = DType::kF32;  // CopyWeightRows / CopyBias output
  uint64_t seed = 0;            // block order; 0 = fresh
};

struct EngineRun {
  ComputeResult result;
  std::vector<double> grad_input;   // BT x H; empty when not asked for
  std::vector<double> grad_weight;  // V x H; empty without a GradBuffer
  std::vector<double> grad_bias;    // V; empty without a GradBuffer or bias
};

// A spec with `strategy` asking for every output (grad_input, per-token loss,
// logprob, entropy, accuracy); the caller fills tokens, targets and grad_out.
ComputeSpec AllOutputsSpec(Strategy strategy);

// Streams the problem's weight (in `chunks` uneven writes) and bias.
absl::StatusOr<std::shared_ptr<const Head>> BuildHead(Engine& engine, const Problem& problem,
                                                      int chunks);

struct CallOutput {
  ComputeResult result;
  std::vector<double> grad_input;  // empty when spec.outputs.grad_input is false
};

// One compute call on an existing head. Fills spec's num_tokens, hidden_dtype,
// targets and ignore_index from the problem and uses grad_out as given.
// Protocol violations by the engine (a row delivered twice or never, a wrong
// byte count) come back as INTERNAL; the engine's own errors as they are.
absl::StatusOr<CallOutput> RunCall(Engine& engine, std::shared_ptr<const Head> head,
                                   const Problem& problem, ComputeSpec spec,
                                   GradBuffer* grad_out, const HarnessOptions& options);

// Widens `count` elements of dtype at src; fp16/bf16/fp32 NaN stays NaN.
std::vector<double> WidenToDoubles(DType dtype, const void* src, int64_t count);

// Reads a GradBuffer back (in `rows_per_copy`-row pieces) as doubles.
absl::StatusOr<std::vector<double>> ReadGradWeight(const GradBuffer& grad, DType dtype,
                                                   int64_t rows_per_copy = 7);
absl::StatusOr<std::vector<double>> ReadGradBias(const GradBuffer& grad, DType dtype);

// BuildHead + NewGradBuffer + RunCall + reads.
absl::StatusOr<EngineRun> RunProblem(Engine& engine, const Problem& problem,
                                     const ComputeSpec& spec, const HarnessOptions& options);

}  // namespace flce::test

#endif  // FLCE_TESTS_SUPPORT_ENGINE_HARNESS_H_
