#include "kernels/cuda/engine/call_rows.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace flce::cuda {

LossParams LossParamsFor(const ComputeSpec& spec, int64_t vocab) {
  LossParams p;
  static_cast<LossOptions&>(p) = spec.options;
  p.vocab = vocab;
  p.entropy_weighted = std::any_of(spec.entropy_weights.begin(), spec.entropy_weights.end(),
                                   [](float e) { return e != 0.0f; });
  if (spec.policy.has_value()) {
    p.has_policy = true;
    p.policy = *spec.policy;
  }
  return p;
}

PlanRequest PlanRequestFor(const ComputeSpec& spec) {
  PlanRequest req;
  req.strategy = spec.strategy;
  req.num_tokens = spec.num_tokens;
  req.hidden_dtype = spec.hidden_dtype;
  req.chunk_tokens = spec.chunk_tokens;
  req.deterministic = spec.deterministic;
  // Under deterministic the chunks stay the budget's whatever the transport,
  // so that results are the same bits through messages and regions.
  req.wire_paced = spec.wire_paced && !spec.deterministic;
  req.plain_logits = PlainLogits(spec.options);
  return req;
}

CallRows::CallRows(const ComputeSpec& spec) : scan_host_rows(!spec.hidden_checked) {
  const int64_t n = spec.num_tokens;
  // a_t per MATH.md: the caller's weights replace the reduction's; ignored
  // tokens always 0; n_valid over the whole request.
  target.resize(n);
  for (int64_t t = 0; t < n; ++t) {
    const bool ignored = spec.targets[t] == spec.ignore_index;
    target[t] = ignored ? -1 : spec.targets[t];
    n_valid += ignored ? 0 : 1;
  }
  token_weight.assign(n, 0.0f);
  policy = spec.policy.has_value();
  for (int64_t t = 0; t < n; ++t) {
    if (target[t] < 0) continue;
    if (policy) {
      token_weight[t] = static_cast<float>(spec.policy->weights[t]);
    } else if (!spec.token_weights.empty()) {
      token_weight[t] = spec.token_weights[t];
    } else if (spec.reduction == Reduction::kMean) {
      token_weight[t] = 1.0f / static_cast<float>(n_valid);
    } else {
      token_weight[t] = 1.0f;
    }
  }
  entropy_weight = spec.entropy_weights.empty() ? std::vector<float>(n, 0.0f) : spec.entropy_weights;
  if (policy) {
    // Tokens that do not count are not read: whatever the caller sent there
    // (NaN included) stays on the host.
    const PolicyObjective& o = *spec.policy;
    kl_coef = o.kl_coef;
    old_logp.assign(n, 0.0f);
    advantage.assign(n, 0.0f);
    ref_logp.assign(n, 0.0f);
    for (int64_t t = 0; t < n; ++t) {
      if (token_weight[t] == 0.0f) continue;
      old_logp[t] = o.old_logp[t];
      advantage[t] = o.advantages[t];
      if (!o.ref_logp.empty()) ref_logp[t] = o.ref_logp[t];
    }
    ratio.assign(n, 0.0f);
    log_ratio.assign(n, 0.0f);
    kl.assign(n, 0.0f);
    policy_flags.assign(n, 0);
  }
  loss.assign(n, 0.0f);
  z_loss.assign(n, 0.0f);
  logprob.assign(n, 0.0f);
  entropy.assign(n, 0.0f);
  argmax.assign(n, -1);
  given.assign(n, 0);
}

absl::Status CallRows::Accept(int64_t offset, int64_t rows, const void* host_rows, int64_t hidden,
                              DType dtype) {
  const int64_t n = static_cast<int64_t>(given.size());
  if (scan_host_rows && host_rows != nullptr && rows > 0 && offset >= 0 && offset + rows <= n) {
    const int64_t bad = FirstNonFinite(dtype, host_rows, rows * hidden);
    if (bad >= 0) return NonFiniteHiddenRow(offset, bad, hidden);
  }
  FLCE_RETURN_IF_ERROR(CheckHiddenRowRange(offset, rows, given));
  std::fill(given.begin() + offset, given.begin() + offset + rows, 1);
  return absl::OkStatus();
}

absl::Status CallRows::CheckAllGiven() const {
  const auto missing = std::find(given.begin(), given.end(), 0);
  if (missing == given.end()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat("Finish before every hidden row was given: token ",
                                                    missing - given.begin(), " of ", given.size(),
                                                    " is missing"));
}

void CallRows::CopyInputs(int64_t begin, int64_t rows, void* block, int64_t stride) const {
  char* at = static_cast<char*>(block);
  auto put = [&](const auto& values, int index) {
    std::memcpy(at + index * stride * 4, values.data() + begin, rows * 4);
  };
  put(target, 0);
  put(token_weight, 1);
  put(entropy_weight, 2);
  if (!policy) return;
  put(old_logp, 3);
  put(advantage, 4);
  put(ref_logp, 5);
}

RowInputs CallRows::DeviceInputs(void* block, int64_t stride) const {
  float* f = static_cast<float*>(block);
  RowInputs in;
  in.target = reinterpret_cast<const int32_t*>(f);
  in.token_weight = f + stride;
  in.entropy_weight = f + 2 * stride;
  if (policy) {
    in.old_logp = f + 3 * stride;
    in.advantage = f + 4 * stride;
    in.ref_logp = f + 5 * stride;
  }
  return in;
}

RowOutputs CallRows::DeviceOutputs(float* block, int64_t stride,
                                   const OutputSelection& wanted) const {
  RowOutputs out;
  out.loss = block;
  out.z_loss = block + stride;
  out.logprob = block + 2 * stride;
  if (wanted.entropy) out.entropy = block + 3 * stride;
  if (wanted.accuracy) out.argmax = reinterpret_cast<int32_t*>(block + 4 * stride);
  if (policy) {
    out.ratio = block + 5 * stride;
    out.log_ratio = block + 6 * stride;
    out.kl = block + 7 * stride;
    out.policy_flags = reinterpret_cast<int32_t*>(block + 8 * stride);
  }
  return out;
}

void CallRows::Store(const float* block, int64_t stride, int64_t begin, int64_t rows) {
  auto take = [&](auto& values, int index) {
    std::memcpy(values.data() + begin, block + index * stride, rows * 4);
  };
  take(loss, 0);
  take(z_loss, 1);
  take(logprob, 2);
  take(entropy, 3);
  take(argmax, 4);
  if (!policy) return;
  take(ratio, 5);
  take(log_ratio, 6);
  take(kl, 7);
  take(policy_flags, 8);
}

void CallRows::FillResult(const OutputSelection& wanted, ComputeResult& result) const {
  const int64_t n = static_cast<int64_t>(target.size());
  for (int64_t t = 0; t < n; ++t) {
    if (wanted.entropy) result.entropy_sum += entropy[t];
    if (target[t] < 0) continue;
    result.loss += static_cast<double>(token_weight[t]) * loss[t];
    result.z_loss += static_cast<double>(token_weight[t]) * z_loss[t];
    if (wanted.accuracy) result.n_correct += argmax[t] == target[t] ? 1 : 0;
    if (policy && token_weight[t] != 0.0f) {
      PolicyTokenTerms terms;
      terms.loss = loss[t];
      terms.ratio = ratio[t];
      terms.log_ratio = log_ratio[t];
      terms.kl = kl[t];
      terms.clipped_low = (policy_flags[t] & kPolicyClippedLow) != 0;
      terms.clipped_high = (policy_flags[t] & kPolicyClippedHigh) != 0;
      terms.dual_clipped = (policy_flags[t] & kPolicyDualClipped) != 0;
      result.policy.Add(terms, token_weight[t], kl_coef);
    }
  }
  result.n_valid = n_valid;
  if (wanted.per_token_loss) result.per_token_loss = loss;
  if (wanted.logprob) result.logprob = logprob;
  if (wanted.entropy) result.entropy = entropy;
  if (wanted.accuracy) {
    result.correct.resize(n);
    for (int64_t t = 0; t < n; ++t) result.correct[t] = target[t] >= 0 && argmax[t] == target[t];
  }
}

absl::Status UploadRowInputs(const CallRows& rows, void* block, cudaStream_t stream,
                             DeviceHealth* health) {
  const int64_t n = static_cast<int64_t>(rows.target.size());
  std::vector<float> host(static_cast<size_t>(rows.input_arrays()) * n);
  rows.CopyInputs(0, n, host.data(), n);
  FLCE_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(block, host.data(), host.size() * 4, cudaMemcpyHostToDevice, stream), health);
  FLCE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream), health);
  return absl::OkStatus();
}

absl::Status DownloadRowOutputs(const float* outputs, int64_t n, cudaStream_t stream,
                                DeviceHealth* health, CallRows& rows) {
  std::vector<float> host(static_cast<size_t>(rows.output_arrays()) * n);
  FLCE_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(host.data(), outputs, host.size() * 4, cudaMemcpyDeviceToHost, stream),
      health);
  FLCE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream), health);
  rows.Store(host.data(), n, 0, n);
  return absl::OkStatus();
}

absl::Status SinkGradInput(const char* grad_input, int64_t n, int64_t row_bytes,
                           const GradInputSink& sink, cudaStream_t stream, DeviceHealth* health) {
  constexpr int64_t kSinkRows = 8192;
  for (int64_t b = 0; b < n; b += kSinkRows) {
    const int64_t rows = std::min(kSinkRows, n - b);
    std::string data(rows * row_bytes, '\0');
    FLCE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(data.data(), grad_input + b * row_bytes, data.size(),
                                              cudaMemcpyDeviceToHost, stream),
                              health);
    FLCE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream), health);
    if (sink) sink(b, rows, std::move(data));
  }
  return absl::OkStatus();
}

}  // namespace flce::cuda
