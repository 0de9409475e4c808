#include "kernels/preference_call.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "core/status_macros.h"
#include "kernels/preference_passes.h"

namespace flce {

PreferenceComputeCall::PreferenceComputeCall(Engine& engine, std::shared_ptr<const Head> head,
                                             ComputeSpec spec, GradInputSink sink,
                                             int64_t row_bytes)
    : engine_(engine),
      head_(std::move(head)),
      spec_(std::move(spec)),
      sink_(std::move(sink)),
      row_bytes_(row_bytes) {}

absl::StatusOr<std::unique_ptr<ComputeCall>> PreferenceComputeCall::Start(
    Engine& engine, std::shared_ptr<const Head> head, ComputeSpec spec, GradInputSink sink) {
  FLCE_RETURN_IF_ERROR(ValidateComputeSpec(head->spec(), spec));
  const int64_t row_bytes = head->spec().hidden_size * DTypeSize(spec.hidden_dtype);
  std::unique_ptr<PreferenceComputeCall> call(new PreferenceComputeCall(
      engine, head, std::move(spec), std::move(sink), row_bytes));
  FLCE_ASSIGN_OR_RETURN(
      call->first_,
      engine.StartCompute(head, LogProbPassSpec(call->spec_, 0, call->spec_.num_tokens), nullptr));
  call->held_rows_.assign(call->spec_.num_tokens, 0);
  return std::unique_ptr<ComputeCall>(std::move(call));
}

absl::Status PreferenceComputeCall::AddHidden(int64_t token_offset, int64_t rows,
                                              const void* data) {
  if (finished_) return absl::FailedPreconditionError("AddHidden after Finish");
  // The first pass checks the rows (range, overlap, finiteness) before they are kept.
  FLCE_RETURN_IF_ERROR(first_->AddHidden(token_offset, rows, data));
  if (rows == 0) return absl::OkStatus();
  // Taken with the first host rows: a call whose rows are all in peer memory holds none.
  if (held_.data() == nullptr) held_ = HeldRows(spec_.num_tokens * row_bytes_);
  std::memcpy(held_.data() + token_offset * row_bytes_, data, rows * row_bytes_);
  std::fill(held_rows_.begin() + token_offset, held_rows_.begin() + token_offset + rows, 1);
  return absl::OkStatus();
}

absl::StatusOr<PeerRows> PreferenceComputeCall::AddHiddenFromPeer(int64_t token_offset,
                                                                  int64_t rows,
                                                                  const PeerMemory& memory,
                                                                  int64_t byte_offset) {
  if (finished_) return absl::FailedPreconditionError("AddHiddenFromPeer after Finish");
  FLCE_ASSIGN_OR_RETURN(PeerRows found,
                        first_->AddHiddenFromPeer(token_offset, rows, memory, byte_offset));
  if (rows > 0) peer_pieces_.push_back({token_offset, rows, &memory, byte_offset});
  return found;
}

absl::StatusOr<ComputeResult> PreferenceComputeCall::Finish() {
  if (finished_) return absl::FailedPreconditionError("Finish called twice");
  finished_ = true;
  FLCE_ASSIGN_OR_RETURN(ComputeResult first, first_->Finish());
  first_.reset();
  const int64_t n = spec_.num_tokens;
  PreferenceEvaluation objective =
      EvaluatePreference(*spec_.preference, first.logprob, CountedTokens(spec_));

  ComputeSpec second = spec_;
  second.preference.reset();
  second.token_weights = std::move(objective.token_weights);
  second.wire_paced = false;  // every row is here: the plan's own chunks
  FLCE_ASSIGN_OR_RETURN(std::unique_ptr<ComputeCall> call,
                        engine_.StartCompute(head_, std::move(second), sink_));
  // The rows in token order, in pieces of the runs they were kept in.
  constexpr int64_t kPieceRows = 4096;
  for (int64_t t = 0; t < n;) {
    if (!held_rows_[t]) {
      ++t;
      continue;
    }
    int64_t end = t;
    while (end < n && held_rows_[end] && end - t < kPieceRows) ++end;
    FLCE_RETURN_IF_ERROR(call->AddHidden(t, end - t, held_.data() + t * row_bytes_));
    t = end;
  }
  for (const PeerPiece& piece : peer_pieces_) {
    FLCE_ASSIGN_OR_RETURN(PeerRows again, call->AddHiddenFromPeer(piece.token_offset, piece.rows,
                                                                  *piece.memory,
                                                                  piece.byte_offset));
    if (again.first_non_finite >= 0) {
      return absl::InvalidArgumentError(
          "hidden rows in peer memory changed between the two passes of a preference "
          "objective and now hold a non-finite value");
    }
  }
  FLCE_ASSIGN_OR_RETURN(ComputeResult result, call->Finish());
  result.loss = objective.loss;
  result.z_loss = 0.0;
  result.preference = objective.stats;
  result.preference_first_pass_ms = first.engine_ms;
  result.engine_ms += first.engine_ms;
  result.wait_ms += first.wait_ms;
  return result;
}

}  // namespace flce
