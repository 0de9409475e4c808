#include "kernels/cpu/cpu_compute_call.h"

#include <algorithm>
#include <chrono>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "kernels/cpu/chunk_kernel.h"

namespace flce::cpu {

absl::StatusOr<std::unique_ptr<CpuComputeCall>> CpuComputeCall::Create(
    std::shared_ptr<CpuContext> ctx, std::shared_ptr<const Head> head, ComputeSpec spec,
    GradInputSink sink) {
  if (head == nullptr) return absl::InvalidArgumentError("no head");
  if (dynamic_cast<const CpuHead*>(head.get()) == nullptr) {
    return absl::InvalidArgumentError("head was not built by the CPU engine");
  }
  FLCE_RETURN_IF_ERROR(ValidateComputeSpec(head->spec(), spec));
  CpuGradBuffer* grad = nullptr;
  if (spec.grad_out != nullptr) {
    grad = dynamic_cast<CpuGradBuffer*>(spec.grad_out);
    if (grad == nullptr) {
      return absl::InvalidArgumentError("grad_out was not allocated by the CPU engine");
    }
  }
  if (spec.outputs.grad_input && !sink) {
    return absl::InvalidArgumentError("grad_input asked for without a sink");
  }
  FLCE_ASSIGN_OR_RETURN(
      int64_t chunk_tokens,
      ctx->ChooseChunkTokens(spec.chunk_tokens, head->spec().vocab_size, head->spec().hidden_size));
  return std::unique_ptr<CpuComputeCall>(new CpuComputeCall(
      std::move(ctx), std::move(head), std::move(spec), std::move(sink), grad, chunk_tokens));
}

CpuComputeCall::CpuComputeCall(std::shared_ptr<CpuContext> ctx, std::shared_ptr<const Head> head,
                               ComputeSpec spec, GradInputSink sink, CpuGradBuffer* grad,
                               int64_t chunk_tokens)
    : ctx_(std::move(ctx)),
      head_holder_(std::move(head)),
      head_(static_cast<const CpuHead&>(*head_holder_)),
      spec_(std::move(spec)),
      sink_(std::move(sink)),
      grad_(grad),
      chunk_tokens_(chunk_tokens),
      hidden_size_(head_.spec().hidden_size),
      want_grad_input_(spec_.outputs.grad_input) {
  const int64_t BT = spec_.num_tokens;
  targets_.resize(BT);
  for (int64_t t = 0; t < BT; ++t) {
    const bool valid = spec_.targets[t] != spec_.ignore_index;
    targets_[t] = valid ? spec_.targets[t] : -1;
    n_valid_ += valid ? 1 : 0;
  }
  // a_t of MATH.md: the caller's weights replace the reduction's; mean uses
  // n_valid of the whole request; ignored tokens get 0 whatever was given.
  token_weights_.assign(BT, 0.0);
  for (int64_t t = 0; t < BT; ++t) {
    if (targets_[t] < 0) continue;
    if (spec_.policy.has_value()) {
      token_weights_[t] = spec_.policy->weights[t];
    } else if (!spec_.token_weights.empty()) {
      token_weights_[t] = spec_.token_weights[t];
    } else if (spec_.reduction == Reduction::kMean) {
      token_weights_[t] = 1.0 / static_cast<double>(n_valid_);
    } else {
      token_weights_[t] = 1.0;
    }
  }
  entropy_weights_.assign(BT, 0.0);
  for (int64_t t = 0; t < static_cast<int64_t>(spec_.entropy_weights.size()); ++t) {
    entropy_weights_[t] = spec_.entropy_weights[t];
  }
  received_.assign(BT, 0);
  stats_.resize(BT);

  const int64_t chunk = std::min(chunk_tokens_, std::max<int64_t>(BT, 1));
  pending_hidden_.reserve(chunk * hidden_size_);
  pending_tokens_.reserve(chunk);
  ctx_->TrackCallBytes(static_cast<int64_t>(pending_hidden_.capacity() * sizeof(float)));
}

CpuComputeCall::~CpuComputeCall() {
  ctx_->TrackCallBytes(-static_cast<int64_t>(pending_hidden_.capacity() * sizeof(float)));
}

absl::Status CpuComputeCall::AddHidden(int64_t token_offset, int64_t rows, const void* data) {
  std::lock_guard<std::mutex> lock(mu_);
  if (finished_) return absl::FailedPreconditionError("AddHidden after Finish");
  const int64_t BT = spec_.num_tokens;
  if (token_offset < 0 || rows < 0 || token_offset > BT || rows > BT - token_offset) {
    return absl::InvalidArgumentError(absl::StrCat("hidden rows [", token_offset, ", ",
                                                   token_offset + rows, ") outside [0, ", BT,
                                                   ")"));
  }
  if (rows == 0) return absl::OkStatus();
  if (data == nullptr) return absl::InvalidArgumentError("hidden data is null");
  for (int64_t t = token_offset; t < token_offset + rows; ++t) {
    if (received_[t]) {
      return absl::InvalidArgumentError(absl::StrCat("hidden rows [", token_offset, ", ",
                                                     token_offset + rows, ") overlap token ", t,
                                                     ", which was already given"));
    }
  }
  const int64_t H = hidden_size_;
  const int64_t elem = DTypeSize(spec_.hidden_dtype);
  const int64_t bad =
      spec_.hidden_checked ? -1 : FirstNonFinite(spec_.hidden_dtype, data, rows * H);
  if (bad >= 0) {
    return absl::InvalidArgumentError(absl::StrCat("hidden of token ", token_offset + bad / H,
                                                   " is not finite (NaN or Inf)"));
  }
  for (int64_t t = token_offset; t < token_offset + rows; ++t) received_[t] = 1;
  received_count_ += rows;

  const char* bytes = static_cast<const char*>(data);
  const DType head_dtype = head_.spec().dtype;
  int64_t done = 0;
  while (done < rows) {
    const int64_t room = chunk_tokens_ - static_cast<int64_t>(pending_tokens_.size());
    const int64_t take = std::min(room, rows - done);
    const size_t old = pending_hidden_.size();
    pending_hidden_.resize(old + take * H);
    ToFloat(spec_.hidden_dtype, bytes + done * H * elem, pending_hidden_.data() + old, take * H);
    // The contract: hidden is converted to W's dtype for the GEMMs.
    if (head_dtype != spec_.hidden_dtype && head_dtype != DType::kF32) {
      RoundTo(head_dtype, pending_hidden_.data() + old, take * H);
    }
    for (int64_t r = 0; r < take; ++r) pending_tokens_.push_back(token_offset + done + r);
    done += take;
    if (static_cast<int64_t>(pending_tokens_.size()) == chunk_tokens_) {
      FLCE_RETURN_IF_ERROR(Flush());
    }
  }
  return absl::OkStatus();
}

absl::Status CpuComputeCall::Flush() {
  const int64_t M = static_cast<int64_t>(pending_tokens_.size());
  if (M == 0) return absl::OkStatus();
  chunk_targets_.resize(M);
  chunk_token_weights_.resize(M);
  chunk_entropy_weights_.resize(M);
  chunk_stats_.resize(M);
  for (int64_t i = 0; i < M; ++i) {
    const int64_t t = pending_tokens_[i];
    chunk_targets_[i] = targets_[t];
    chunk_token_weights_[i] = token_weights_[t];
    chunk_entropy_weights_[i] = entropy_weights_[t];
  }
  if (spec_.policy.has_value()) {
    const PolicyObjective& policy = *spec_.policy;
    chunk_policy_rows_.resize(M);
    for (int64_t i = 0; i < M; ++i) {
      const int64_t t = pending_tokens_[i];
      PolicyRow& row = chunk_policy_rows_[i];
      row.weight = token_weights_[t];
      if (row.weight == 0.0) continue;  // its inputs are not read (they may be anything)
      row.old_logp = policy.old_logp[t];
      row.advantage = policy.advantages[t];
      row.ref_logp = policy.ref_logp.empty() ? 0.0 : policy.ref_logp[t];
    }
  }
  ChunkArgs args;
  args.rows = M;
  args.hidden = pending_hidden_.data();
  args.targets = chunk_targets_.data();
  args.token_weights = chunk_token_weights_.data();
  args.entropy_weights = chunk_entropy_weights_.data();
  args.want_grad_input = want_grad_input_;
  args.grad = grad_;
  args.stats = chunk_stats_.data();
  if (spec_.policy.has_value()) {
    args.policy = &*spec_.policy;
    args.policy_rows = chunk_policy_rows_.data();
  }

  // grad_input leaves the shared workspace as wire bytes before the lock is
  // released; the sink runs without it.
  std::vector<std::pair<int64_t, std::string>> messages;
  {
    const auto asked = std::chrono::steady_clock::now();
    std::lock_guard<std::mutex> lock(ctx_->mu);
    const auto start = std::chrono::steady_clock::now();
    // Other calls' chunks hold the shared workspace meanwhile.
    wait_ms_ += std::chrono::duration<double, std::milli>(start - asked).count();
    FLCE_RETURN_IF_ERROR(RunChunk(*ctx_, head_, spec_.options, args));
    if (want_grad_input_) {
      const int64_t H = hidden_size_;
      const int64_t row_bytes = H * DTypeSize(spec_.hidden_dtype);
      int64_t i = 0;
      while (i < M) {
        int64_t j = i + 1;
        while (j < M && pending_tokens_[j] == pending_tokens_[j - 1] + 1) ++j;
        std::string bytes((j - i) * row_bytes, '\0');
        FromFloat(spec_.hidden_dtype, ctx_->grad_input.data() + i * H, bytes.data(), (j - i) * H);
        messages.emplace_back(pending_tokens_[i], std::move(bytes));
        i = j;
      }
    }
    engine_ms_ += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() -
                                                            start)
                      .count();
  }
  for (int64_t i = 0; i < M; ++i) stats_[pending_tokens_[i]] = chunk_stats_[i];
  pending_hidden_.clear();
  pending_tokens_.clear();
  const int64_t row_bytes = hidden_size_ * DTypeSize(spec_.hidden_dtype);
  for (auto& [offset, bytes] : messages) {
    const int64_t rows = static_cast<int64_t>(bytes.size()) / row_bytes;
    sink_(offset, rows, std::move(bytes));
  }
  return absl::OkStatus();
}

absl::StatusOr<ComputeResult> CpuComputeCall::Finish() {
  std::lock_guard<std::mutex> lock(mu_);
  if (finished_) return absl::FailedPreconditionError("Finish called twice");
  const int64_t BT = spec_.num_tokens;
  if (received_count_ != BT) {
    int64_t missing = 0;
    while (missing < BT && received_[missing]) ++missing;
    return absl::FailedPreconditionError(absl::StrCat("hidden of token ", missing,
                                                      " never given (", received_count_, " of ",
                                                      BT, " tokens received)"));
  }
  FLCE_RETURN_IF_ERROR(Flush());
  finished_ = true;

  ComputeResult result;
  result.strategy_used = kCpuStrategyName;
  result.n_valid = n_valid_;
  result.engine_ms = engine_ms_;
  result.wait_ms = wait_ms_;
  const OutputSelection& want = spec_.outputs;
  if (want.per_token_loss) result.per_token_loss.resize(BT);
  if (want.logprob) result.logprob.resize(BT);
  if (want.entropy) result.entropy.resize(BT);
  if (want.accuracy) result.correct.resize(BT);
  const double s = spec_.options.z_loss_scale;
  for (int64_t t = 0; t < BT; ++t) {
    const RowStats& st = stats_[t];
    const bool valid = targets_[t] >= 0;
    if (valid) {
      result.loss += token_weights_[t] * st.loss;
      if (spec_.policy.has_value() && token_weights_[t] != 0.0) {
        result.policy.Add(st.policy, token_weights_[t], spec_.policy->kl_coef);
      }
      result.z_loss += token_weights_[t] * s * st.lse * st.lse;
      if (want.accuracy) result.n_correct += st.correct ? 1 : 0;
    }
    if (want.entropy) result.entropy_sum += st.entropy;
    if (want.per_token_loss) result.per_token_loss[t] = static_cast<float>(st.loss);
    if (want.logprob) result.logprob[t] = static_cast<float>(st.logprob);
    if (want.entropy) result.entropy[t] = static_cast<float>(st.entropy);
    if (want.accuracy) result.correct[t] = valid && st.correct ? 1 : 0;
  }
  return result;
}

}  // namespace flce::cpu
