// The kernels a call ran, for ComputeSummary.kernels: each distinct set of a
// call's chunks once (DescribeChunkKernels's words), after the tokens of the
// first chunk that ran it where a call's chunks ran more than one.
#ifndef FLCE_KERNELS_CUDA_PLANS_KERNEL_REPORT_H_
#define FLCE_KERNELS_CUDA_PLANS_KERNEL_REPORT_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "kernels/cuda/plans/plans.h"

namespace flce::cuda {

// "logits=L rows=R", then " grad_input=GI" and " grad_weight=GW" where the
// chunk r asks for them: the form of every plan's words.
std::string KernelWords(absl::string_view logits, absl::string_view rows, const DeviceRequest& r,
                        absl::string_view grad_input, absl::string_view grad_weight);
// The words of grad_W on cuBLAS for a chunk of `rows` (Gemm::GradWeightPathFor
// under exec's switches).
const char* CublasGradWeightWords(const Exec& exec, const HeadView& head, int64_t rows);

class KernelReport {
 public:
  // One chunk (chunked, separate), block (vocab_split, fuse_mn) or whole
  // request (naive) as RunChunk or RunPlan's block loop runs it.
  void AddChunk(const Exec& exec, const HeadView& head, const Plan& plan, const DeviceRequest& r);
  // A whole request as RunPlan cuts it.
  void AddRequest(const Exec& exec, const HeadView& head, const Plan& plan, const DeviceRequest& r);
  // A chunk of `rows` tokens that ran `words` (a plan that describes itself:
  // the sharded one).
  void Add(int64_t rows, std::string words);
  // "words", or "N tokens: words; M tokens: words"; empty before any chunk.
  std::string Text() const;

 private:
  std::vector<std::pair<int64_t, std::string>> seen_;
};

}  // namespace flce::cuda

#endif  // FLCE_KERNELS_CUDA_PLANS_KERNEL_REPORT_H_
