#include "kernels/preference_passes.h"

namespace flce {
namespace {

template <typename T>
std::vector<T> Slice(const std::vector<T>& v, int64_t begin, int64_t end) {
  if (v.empty()) return {};
  return std::vector<T>(v.begin() + begin, v.begin() + end);
}

}  // namespace

ComputeSpec SliceSpec(const ComputeSpec& spec, int64_t begin, int64_t end) {
  ComputeSpec s = spec;
  s.preference.reset();
  s.num_tokens = end - begin;
  s.targets = Slice(spec.targets, begin, end);
  s.token_weights.clear();
  s.entropy_weights = Slice(spec.entropy_weights, begin, end);
  return s;
}

ComputeSpec LogProbPassSpec(const ComputeSpec& spec, int64_t begin, int64_t end) {
  ComputeSpec s = SliceSpec(spec, begin, end);
  s.entropy_weights.clear();
  s.outputs = OutputSelection{};
  s.outputs.grad_input = false;
  s.outputs.logprob = true;
  s.grad_out = nullptr;
  s.grad_input_peer = nullptr;
  s.grad_input_peer_offset = 0;
  return s;
}

std::vector<uint8_t> CountedTokens(const ComputeSpec& spec) {
  std::vector<uint8_t> counted(spec.targets.size());
  for (size_t t = 0; t < counted.size(); ++t) counted[t] = spec.targets[t] != spec.ignore_index;
  return counted;
}

}  // namespace flce
