#include "kernels/preference_pipelined_call.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "kernels/preference_passes.h"

namespace flce {
namespace {

template <typename T>
void Place(const std::vector<T>& part, int64_t at, std::vector<T>* whole) {
  if (!part.empty()) std::copy(part.begin(), part.end(), whole->begin() + at);
}

}  // namespace

bool PipelinedPreferenceCall::Suits(const ComputeSpec& spec) {
  return spec.preference.has_value() && spec.wire_paced && !spec.deterministic &&
         spec.grad_input_peer == nullptr;
}

PipelinedPreferenceCall::PipelinedPreferenceCall(Engine& engine, std::shared_ptr<const Head> head,
                                                 ComputeSpec spec, GradInputSink sink,
                                                 int64_t row_bytes, int64_t segment_tokens,
                                                 int64_t block_unit)
    : engine_(engine),
      head_(std::move(head)),
      spec_(std::move(spec)),
      sink_(std::move(sink)),
      row_bytes_(row_bytes),
      segment_tokens_(segment_tokens),
      block_unit_(block_unit),
      start_time_(std::chrono::steady_clock::now()) {}

absl::StatusOr<std::unique_ptr<ComputeCall>> PipelinedPreferenceCall::Start(
    Engine& engine, std::shared_ptr<const Head> head, ComputeSpec spec, GradInputSink sink) {
  FLCE_RETURN_IF_ERROR(ValidateComputeSpec(head->spec(), spec));
  if (!Suits(spec)) return absl::InternalError("not a wire-paced preference call");
  const int64_t row_bytes = head->spec().hidden_size * DTypeSize(spec.hidden_dtype);
  // Segments and blocks of whole chunks: of the caller's chunk where it fixed
  // one (a segment is then one chunk), else of the engine's for the gradient
  // pass over every row at once.
  int64_t unit = spec.chunk_tokens;
  int64_t segment = unit;
  if (unit <= 0) {
    ComputeSpec gradient = SliceSpec(spec, 0, spec.num_tokens);
    gradient.wire_paced = false;
    unit = engine.PlannedChunkTokens(*head, gradient);
    segment = unit <= 0 ? kSegmentTokens : unit * std::max<int64_t>(1, kSegmentTokens / unit);
    unit = std::max<int64_t>(unit, 1);
  }
  std::unique_ptr<PipelinedPreferenceCall> call(new PipelinedPreferenceCall(
      engine, std::move(head), std::move(spec), std::move(sink), row_bytes, segment, unit));
  PipelinedPreferenceCall& c = *call;
  const int64_t n = c.spec_.num_tokens;
  c.counts_ = CountedTokens(c.spec_);
  c.held_ = HeldRows(n * row_bytes);
  c.received_.assign(n, 0);
  for (int64_t b = 0; b < n; b += segment) {
    Segment s;
    s.begin = b;
    s.end = std::min(n, b + segment);
    c.segments_.push_back(std::move(s));
  }
  c.segment_done_.assign(c.segments_.size(), 0);
  // Placeholders until a token's first pass has run: finite in every loss's
  // formulas; the weights of pairs that hold one are not used.
  c.logp_.assign(n, -1.0f);
  const PreferenceObjective& objective = *c.spec_.preference;
  c.pair_remaining_.assign(objective.num_pairs, 0);
  for (int64_t t = 0; t < n; ++t) {
    const int32_t s = objective.sequence_of_token[t];
    if (s >= 0 && c.counts_[t]) ++c.pair_remaining_[s / 2];
  }
  c.gathered_.logprob.assign(c.spec_.outputs.logprob ? n : 0, 0.0f);
  c.gathered_.entropy.assign(c.spec_.outputs.entropy ? n : 0, 0.0f);
  c.gathered_.correct.assign(c.spec_.outputs.accuracy ? n : 0, 0);
  c.worker_ = std::thread([&c] { c.WorkerLoop(); });
  c.finisher_ = std::thread([&c] { c.FinisherLoop(); });
  return std::unique_ptr<ComputeCall>(std::move(call));
}

PipelinedPreferenceCall::~PipelinedPreferenceCall() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
  if (finisher_.joinable()) finisher_.join();
}

void PipelinedPreferenceCall::Fail(const absl::Status& st) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (status_.ok()) status_ = st;
  }
  cv_.notify_all();
}

absl::Status PipelinedPreferenceCall::status() const {
  std::lock_guard<std::mutex> lock(mu_);
  return status_;
}

absl::Status PipelinedPreferenceCall::InCallTokens(const absl::Status& refused, int64_t offset,
                                                   int64_t rows, const void* data) const {
  const int64_t hidden = head_->spec().hidden_size;
  const int64_t bad = FirstNonFinite(spec_.hidden_dtype, data, rows * hidden);
  return bad < 0 ? refused : NonFiniteHiddenRow(offset, bad, hidden);
}

absl::Status PipelinedPreferenceCall::AddHidden(int64_t token_offset, int64_t rows,
                                                const void* data) {
  std::lock_guard<std::mutex> lock(intake_mu_);
  if (finished_) return absl::FailedPreconditionError("AddHidden after Finish");
  FLCE_RETURN_IF_ERROR(status());
  // In the call's token numbers (the segments' calls number their rows from
  // their first; they scan the values).
  absl::Status checked = CheckHiddenRowRange(token_offset, rows, received_);
  if (!checked.ok()) {
    Fail(checked);
    return checked;
  }
  if (rows == 0) return absl::OkStatus();
  const char* bytes = static_cast<const char*>(data);
  std::memcpy(held_.data() + token_offset * row_bytes_, bytes, rows * row_bytes_);
  std::fill(received_.begin() + token_offset, received_.begin() + token_offset + rows, 1);
  for (int64_t t = token_offset; t < token_offset + rows;) {
    Segment& segment = segments_[t / segment_tokens_];
    const int64_t piece = std::min(token_offset + rows, segment.end) - t;
    const char* at = bytes + (t - token_offset) * row_bytes_;
    absl::Status fed = FeedSegment(segment, t, piece, at);
    if (!fed.ok()) {
      if (fed.code() == absl::StatusCode::kInvalidArgument) fed = InCallTokens(fed, t, piece, at);
      Fail(fed);
      return fed;
    }
    t += piece;
  }
  return absl::OkStatus();
}

absl::Status PipelinedPreferenceCall::FeedSegment(Segment& segment, int64_t offset, int64_t rows,
                                                  const char* data) {
  if (segment.call == nullptr) {
    // The segment is the size of a chunk or a few: it runs once its rows are
    // in, in whole chunks, rather than in the small edge chunks of a call
    // whose rows arrive.
    ComputeSpec first = LogProbPassSpec(spec_, segment.begin, segment.end);
    first.wire_paced = false;
    FLCE_ASSIGN_OR_RETURN(segment.call, engine_.StartCompute(head_, std::move(first), nullptr));
  }
  FLCE_RETURN_IF_ERROR(segment.call->AddHidden(offset - segment.begin, rows, data));
  segment.received += rows;
  if (segment.received == segment.end - segment.begin) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      whole_.push_back(&segment);
    }
    cv_.notify_all();
  }
  return absl::OkStatus();
}

void PipelinedPreferenceCall::WorkerLoop() {
  for (;;) {
    Segment* segment = nullptr;
    bool end = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stop_ || !status_.ok() || !whole_.empty() || end_; });
      if (stop_ || !status_.ok()) return;
      if (!whole_.empty()) {
        segment = whole_.front();
        whole_.pop_front();
      } else {
        end = true;
      }
    }
    absl::Status st = segment != nullptr ? FinishSegment(*segment) : RunReadyBlocks(true);
    if (st.ok() && segment != nullptr) st = RunReadyBlocks(false);
    if (!st.ok()) Fail(st);
    if (end && st.ok()) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        last_block_ = true;
      }
      cv_.notify_all();
    }
    if (end || !st.ok()) return;
  }
}

void PipelinedPreferenceCall::FinisherLoop() {
  for (;;) {
    Block block;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stop_ || !status_.ok() || !started_.empty() || last_block_; });
      if (stop_ || !status_.ok()) return;
      if (started_.empty()) return;  // last_block_: every block finished
      block.begin = started_.front().begin;
      block.call = std::move(started_.front().call);
    }
    absl::Status st = FinishBlock(block);
    {
      std::lock_guard<std::mutex> lock(mu_);
      started_.pop_front();  // only now: the worker counts it in flight until here
    }
    cv_.notify_all();
    if (!st.ok()) {
      Fail(st);
      return;
    }
  }
}

absl::Status PipelinedPreferenceCall::FinishSegment(Segment& segment) {
  // The segment's call was handed over whole: the receiving side no longer touches it.
  std::unique_ptr<ComputeCall> call = std::move(segment.call);
  FLCE_ASSIGN_OR_RETURN(ComputeResult first, call->Finish());
  call.reset();
  first_pass_ms_ += first.engine_ms;
  wait_ms_ += first.wait_ms;
  std::copy(first.logprob.begin(), first.logprob.end(), logp_.begin() + segment.begin);
  const std::vector<int32_t>& sequence = spec_.preference->sequence_of_token;
  for (int64_t t = segment.begin; t < segment.end; ++t) {
    if (sequence[t] >= 0 && counts_[t]) --pair_remaining_[sequence[t] / 2];
  }
  segment_done_[segment.begin / segment_tokens_] = 1;
  return absl::OkStatus();
}

bool PipelinedPreferenceCall::Ready(int64_t t) const {
  if (!segment_done_[t / segment_tokens_]) return false;
  const int32_t s = spec_.preference->sequence_of_token[t];
  return s < 0 || !counts_[t] || pair_remaining_[s / 2] == 0;
}

absl::Status PipelinedPreferenceCall::RunReadyBlocks(bool final) {
  const int64_t n = spec_.num_tokens;
  int64_t end = cursor_;
  while (end < n && Ready(end)) ++end;
  if (final && end < n) {
    return absl::InternalError(absl::StrCat("token ", end, " has no gradient weight at Finish"));
  }
  if (!final) end = cursor_ + (end - cursor_) / block_unit_ * block_unit_;
  if (end == cursor_ || (!final && end - cursor_ < segment_tokens_)) return absl::OkStatus();
  FLCE_RETURN_IF_ERROR(StartBlock(cursor_, end));
  cursor_ = end;
  return absl::OkStatus();
}

absl::Status PipelinedPreferenceCall::StartBlock(int64_t begin, int64_t end) {
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] {
      return stop_ || !status_.ok() || started_.size() < kBlocksInFlight;
    });
    if (stop_) return absl::CancelledError("the call was dropped");
    if (!status_.ok()) return status_;
  }
  // Every pair with a token in [begin, end) has all its log-probs: their
  // weights are final whatever the other pairs' placeholders are.
  PreferenceEvaluation objective = EvaluatePreference(*spec_.preference, logp_, counts_);
  ComputeSpec block = SliceSpec(spec_, begin, end);
  block.token_weights.assign(objective.token_weights.begin() + begin,
                             objective.token_weights.begin() + end);
  block.wire_paced = false;  // every row of the block is here
  GradInputSink sink;
  if (sink_) {
    sink = [this, begin](int64_t offset, int64_t rows, std::string data) {
      std::lock_guard<std::mutex> lock(sink_mu_);
      sink_(begin + offset, rows, std::move(data));
    };
  }
  FLCE_ASSIGN_OR_RETURN(std::unique_ptr<ComputeCall> call,
                        engine_.StartCompute(head_, std::move(block), std::move(sink)));
  FLCE_RETURN_IF_ERROR(call->AddHidden(0, end - begin, held_.data() + begin * row_bytes_));
  {
    std::lock_guard<std::mutex> lock(mu_);
    started_.push_back(Block{begin, std::move(call)});
  }
  cv_.notify_all();
  return absl::OkStatus();
}

absl::Status PipelinedPreferenceCall::FinishBlock(Block& block) {
  const int64_t begin = block.begin;
  FLCE_ASSIGN_OR_RETURN(ComputeResult r, block.call->Finish());
  block.call.reset();
  gathered_.n_valid += r.n_valid;
  gathered_.n_correct += r.n_correct;
  gathered_.entropy_sum += r.entropy_sum;
  block_wait_ms_ += r.wait_ms;
  if (gathered_.strategy_used.empty()) {
    gathered_.strategy_used = r.strategy_used;
  } else if (r.strategy_used != gathered_.strategy_used &&
             gathered_.strategy_used.find("+" + r.strategy_used) == std::string::npos) {
    gathered_.strategy_used += "+" + r.strategy_used;
  }
  if (gathered_.kernels.find(r.kernels) == std::string::npos) {
    gathered_.kernels += (gathered_.kernels.empty() ? "" : "; ") + r.kernels;
  }
  Place(r.logprob, begin, &gathered_.logprob);
  Place(r.entropy, begin, &gathered_.entropy);
  Place(r.correct, begin, &gathered_.correct);
  return absl::OkStatus();
}

absl::StatusOr<ComputeResult> PipelinedPreferenceCall::Finish() {
  {
    std::lock_guard<std::mutex> lock(intake_mu_);
    if (finished_) return absl::FailedPreconditionError("Finish called twice");
    finished_ = true;
    FLCE_RETURN_IF_ERROR(status());
    const auto missing = std::find(received_.begin(), received_.end(), 0);
    if (missing != received_.end()) {
      const absl::Status st = absl::FailedPreconditionError(
          absl::StrCat("Finish before every hidden row was given: token ",
                       missing - received_.begin(), " of ", received_.size(), " is missing"));
      Fail(st);
      return st;
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    end_ = true;
  }
  cv_.notify_all();
  worker_.join();
  finisher_.join();
  FLCE_RETURN_IF_ERROR(status());
  PreferenceEvaluation objective = EvaluatePreference(*spec_.preference, logp_, counts_);
  ComputeResult result = std::move(gathered_);
  result.loss = objective.loss;
  result.z_loss = 0.0;
  result.preference = objective.stats;
  result.preference_first_pass_ms = first_pass_ms_;
  result.wait_ms = wait_ms_ + block_wait_ms_;
  // As a wire-paced call's: from the start to the last block, the wire's pace included.
  result.engine_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() -
                                                              start_time_)
                         .count();
  return result;
}

}  // namespace flce
