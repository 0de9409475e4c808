// RunPlan: a request through its plan, block by block. Each plan is a file of
// its own (plan_select.cc chooses; plan_chunked.cc, plan_naive.cc,
// plan_vocab_split.cc, plan_fuse_mn.cc run; plan_parts.h is what they share).
#include "kernels/cuda/plans/plans.h"

#include <algorithm>

#include "core/status_macros.h"
#include "kernels/cuda/plans/plan_parts.h"

namespace flce::cuda {

absl::Status RunPlan(const Exec& exec_given, const HeadView& head, const Plan& plan,
                     const DeviceRequest& r, char* scratch) {
  const Exec exec = ExecUnder(exec_given, plan);
  switch (plan.strategy) {
    case Strategy::kChunked:
    case Strategy::kSeparate:
      for (int64_t b = 0; b < r.rows; b += plan.chunk_tokens) {
        FLCE_RETURN_IF_ERROR(
            RunChunk(exec, head, plan,
                     plan_parts::Slice(r, b, std::min(plan.chunk_tokens, r.rows - b), head.hidden),
                     scratch));
      }
      return absl::OkStatus();
    case Strategy::kNaive:
      return plan_parts::RunNaive(exec, head, r, scratch);
    case Strategy::kVocabSplit:
    case Strategy::kFuseMN:
      for (int64_t b = 0; b < r.rows; b += plan.chunk_tokens) {
        DeviceRequest block =
            plan_parts::Slice(r, b, std::min(plan.chunk_tokens, r.rows - b), head.hidden);
        if (plan.strategy == Strategy::kVocabSplit) {
          FLCE_RETURN_IF_ERROR(plan_parts::RunVocabSplitBlock(exec, head, plan, block, scratch));
        } else {
          FLCE_RETURN_IF_ERROR(plan_parts::RunFuseMNBlock(exec, head, plan, block, scratch));
        }
      }
      return absl::OkStatus();
    case Strategy::kAuto:
      break;
  }
  return absl::InvalidArgumentError("plan without a strategy");
}

}  // namespace flce::cuda
