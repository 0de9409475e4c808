#include "kernels/cpu/cpu_context.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "kernels/cpu/host_memory.h"
#include "kernels/cpu/row_pass.h"

namespace flce::cpu {

int64_t CpuContext::BytesFor(int64_t chunk_tokens, int64_t vocab_size,
                             int64_t hidden_size) const {
  const int64_t floats = chunk_tokens * vocab_size + chunk_tokens * hidden_size +
                         threads * kRowScratchPerVocab * vocab_size +
                         chunk_tokens * hidden_size;
  return floats * static_cast<int64_t>(sizeof(float));
}

absl::StatusOr<int64_t> CpuContext::ChooseChunkTokens(int64_t requested, int64_t vocab_size,
                                                      int64_t hidden_size) const {
  if (BytesFor(1, vocab_size, hidden_size) > budget) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "workspace budget of ", budget,
        " bytes (the server's --workspace-mb) cannot hold one token of a V=", vocab_size,
        " H=", hidden_size, " head (", BytesFor(1, vocab_size, hidden_size), " bytes)"));
  }
  const int64_t per_token = BytesFor(2, vocab_size, hidden_size) - BytesFor(1, vocab_size, hidden_size);
  const int64_t fixed = BytesFor(1, vocab_size, hidden_size) - per_token;
  const int64_t fit = (budget - fixed) / per_token;
  const int64_t wanted = requested > 0 ? requested : kDefaultChunkTokens;
  return std::max<int64_t>(1, std::min(wanted, fit));
}

absl::Status CpuContext::Reserve(int64_t chunk_tokens, int64_t vocab_size, int64_t hidden_size) {
  const size_t logits_size = static_cast<size_t>(chunk_tokens * vocab_size);
  const size_t grad_size = static_cast<size_t>(chunk_tokens * hidden_size);
  const size_t scratch_size = static_cast<size_t>(threads * kRowScratchPerVocab * vocab_size);
  // Bounded by --workspace-mb, which may still be more than the host has.
  FLCE_RETURN_IF_ERROR(TryAllocate(
      "the engine workspace (--workspace-mb)",
      static_cast<int64_t>((logits_size + grad_size + scratch_size) * sizeof(float)), [&] {
        if (logits.size() < logits_size) logits.resize(logits_size);
        if (grad_input.size() < grad_size) grad_input.resize(grad_size);
        if (scratch.size() < scratch_size) scratch.resize(scratch_size);
      }));
  shared_bytes = static_cast<int64_t>((logits.size() + grad_input.size() + scratch.size()) *
                                      sizeof(float));
  UpdatePeak();
  return absl::OkStatus();
}

void CpuContext::TrackCallBytes(int64_t delta) {
  call_bytes += delta;
  UpdatePeak();
}

void CpuContext::UpdatePeak() {
  const int64_t now = shared_bytes.load() + call_bytes.load();
  int64_t seen = peak.load();
  while (now > seen && !peak.compare_exchange_weak(seen, now)) {
  }
}

}  // namespace flce::cpu
