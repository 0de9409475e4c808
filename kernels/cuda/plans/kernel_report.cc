#include "kernels/cuda/plans/kernel_report.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/plans/plan_parts.h"

namespace flce::cuda {
namespace {

// The plans whose every GEMM is cuBLAS's on fp32 logits.
std::string DescribeBufferedKernels(const Exec& exec, const HeadView& head, const Plan& plan,
                                    const DeviceRequest& r) {
  const bool naive = plan.strategy == Strategy::kNaive;
  const char* logits = naive ? "cublas_fp32" : "cublas_fp32_splits";
  const char* rows = naive ? "naive" : "online_softmax";
  if (plan.strategy == Strategy::kFuseMN) {
    std::string out = absl::StrCat("logits=", logits, " rows=", rows);
    if (plan_parts::WantsBackward(r)) absl::StrAppend(&out, " backward=fuse_mn_tiles");
    return out;
  }
  return KernelWords(logits, rows, r, "cublas",
                     CublasGradWeightWords(ExecUnder(exec, plan), head, r.rows));
}

}  // namespace

std::string KernelWords(absl::string_view logits, absl::string_view rows, const DeviceRequest& r,
                        absl::string_view grad_input, absl::string_view grad_weight) {
  std::string out = absl::StrCat("logits=", logits, " rows=", rows);
  if (r.grad_input != nullptr) absl::StrAppend(&out, " grad_input=", grad_input);
  if (r.grad_weight != nullptr) absl::StrAppend(&out, " grad_weight=", grad_weight);
  return out;
}

const char* CublasGradWeightWords(const Exec& exec, const HeadView& head, int64_t rows) {
  return Gemm::GradWeightPathName(
      plan_parts::MakeGemm(exec, head).GradWeightPathFor(rows, head.hidden));
}

void KernelReport::AddChunk(const Exec& exec, const HeadView& head, const Plan& plan,
                            const DeviceRequest& r) {
  const bool chunked = plan.strategy == Strategy::kChunked || plan.strategy == Strategy::kSeparate;
  Add(r.rows, chunked ? DescribeChunkKernels(exec, head, plan, r)
                     : DescribeBufferedKernels(exec, head, plan, r));
}

void KernelReport::Add(int64_t rows, std::string words) {
  for (const auto& [first_rows, seen] : seen_) {
    if (seen == words) return;
  }
  seen_.emplace_back(rows, std::move(words));
}

void KernelReport::AddRequest(const Exec& exec, const HeadView& head, const Plan& plan,
                              const DeviceRequest& r) {
  if (plan.strategy == Strategy::kNaive || plan.chunk_tokens <= 0 || r.rows <= 0) {
    AddChunk(exec, head, plan, r);
    return;
  }
  // Every block but the last has chunk_tokens rows.
  const int64_t first = std::min(plan.chunk_tokens, r.rows);
  AddChunk(exec, head, plan, plan_parts::Slice(r, 0, first, head.hidden));
  const int64_t last_begin = (r.rows - 1) / plan.chunk_tokens * plan.chunk_tokens;
  if (last_begin > 0) {
    AddChunk(exec, head, plan,
             plan_parts::Slice(r, last_begin, r.rows - last_begin, head.hidden));
  }
}

std::string KernelReport::Text() const {
  if (seen_.size() == 1) return seen_[0].second;
  std::string out;
  for (const auto& [rows, words] : seen_) {
    absl::StrAppend(&out, out.empty() ? "" : "; ", rows, " tokens: ", words);
  }
  return out;
}

}  // namespace flce::cuda
