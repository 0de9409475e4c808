// The naive plan: the whole tokens x V logits, softmax and dlogits at once (the reference point).
#include <algorithm>

#include "core/status_macros.h"
#include "kernels/cuda/ops/fused_row_kernel.cuh"
#include "kernels/cuda/plans/plan_parts.h"

namespace flce::cuda::plan_parts {

absl::Status RunNaive(const Exec& exec, const HeadView& head, const DeviceRequest& r,
                      char* scratch) {
  const TokenBytes tb = PerTokenBytes(head, r.hidden_dtype, false);
  const Scratch s = Carve(scratch, r.rows, head.padded_vocab, tb, head, true, false);
  FLCE_ASSIGN_OR_RETURN(const void* x, HeadDtypeHidden(exec, head, r, s));
  FLCE_RETURN_IF_ERROR(MakeGemm(exec, head)
                           .Logits(x, head.weight, r.rows, head.padded_vocab, head.hidden, s.logits,
                                   head.padded_vocab));
  FusedRowArgs args;
  args.logits = s.logits;
  args.ld_logits = head.padded_vocab;
  args.padded_vocab = head.padded_vocab;
  args.rows = r.rows;
  args.bias = head.bias;
  args.dlogits = s.dlogits;
  args.dlogits_row_bytes = head.padded_vocab * DTypeSize(head.dtype);
  args.probs = static_cast<float*>(s.probs);
  args.in = r.in;
  args.out = r.out;
  args.params = r.params;
  FLCE_RETURN_IF_ERROR(LaunchFusedRows(head.dtype, args, exec.stream, exec.health));
  if (!WantsBackward(r)) return absl::OkStatus();
  return Backward(exec, head, r, s, x, s.dlogits, head.padded_vocab);
}

}  // namespace flce::cuda::plan_parts
