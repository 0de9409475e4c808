#include "server/validate/validation.h"

#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>
#include <string>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "core/loss_option_checks.h"
#include "core/status_macros.h"
#include "server/validate/policy_header.h"
#include "server/validate/preference_header.h"

namespace flce::server {
namespace {

constexpr int64_t kMaxIdBytes = 256;

// num_tokens fp32 values, finite and at most `max_abs` in magnitude; empty =
// not given.
absl::StatusOr<std::vector<float>> PerTokenFloats(const std::string& bytes, absl::string_view field,
                                                  int64_t num_tokens, float max_abs) {
  std::vector<float> out;
  if (bytes.empty()) return out;
  int64_t want = num_tokens * static_cast<int64_t>(sizeof(float));
  if (static_cast<int64_t>(bytes.size()) != want) {
    return absl::InvalidArgumentError(absl::StrCat(field, " has ", bytes.size(),
                                                   " bytes; expected ", want, " (num_tokens ",
                                                   num_tokens, " x 4-byte fp32) or none"));
  }
  out.resize(num_tokens);
  std::memcpy(out.data(), bytes.data(), bytes.size());
  for (int64_t t = 0; t < num_tokens; ++t) {
    if (!(std::abs(out[t]) <= max_abs)) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, "[", t, "] = ", out[t], " is outside [-", max_abs, ", ", max_abs, "]"));
    }
  }
  return out;
}

// INVALID_ARGUMENT naming `field` and the index of the first NaN or Inf.
template <typename T>
absl::Status CheckAllFinite(const std::vector<T>& values, absl::string_view field) {
  for (size_t i = 0; i < values.size(); ++i) {
    if (!std::isfinite(static_cast<double>(values[i]))) {
      return absl::InvalidArgumentError(absl::StrCat(
          kNonFiniteResult, field, "[", i, "] = ", values[i], " is not finite: nothing landed"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateText(absl::string_view text, absl::string_view field, int64_t max_bytes) {
  if (static_cast<int64_t>(text.size()) > max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " is ", text.size(), " bytes long; at most ", max_bytes));
  }
  for (char c : text) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      return absl::InvalidArgumentError(absl::StrCat(field, " holds a control character"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateRequestId(absl::string_view id, absl::string_view field) {
  return id.empty() ? absl::OkStatus() : ValidateId(id, field);
}

absl::Status MessageAfterEndError(absl::string_view end_field, absl::string_view got) {
  return absl::InvalidArgumentError(absl::StrCat(
      "a message after the end message (", end_field, "; then got ", got,
      "): nothing landed; the end message is the last one, half-close the stream right after it"));
}

absl::Status CheckOutputsFinite(const ComputeResult& result) {
  for (const auto& [name, value] : {std::pair<const char*, double>{"loss", result.loss},
                                    {"z_loss", result.z_loss},
                                    {"entropy_sum", result.entropy_sum}}) {
    if (!std::isfinite(value)) {
      return absl::InvalidArgumentError(absl::StrCat(
          kNonFiniteResult, name, " = ", value,
          " is not finite: nothing landed; the options (temperature, softcap, weights) or the "
          "hidden states' scale overflow fp32 for this data"));
    }
  }
  absl::Status s = CheckAllFinite(result.per_token_loss, "per-token loss");
  if (s.ok()) s = CheckAllFinite(result.logprob, "logprob");
  if (s.ok()) s = CheckAllFinite(result.entropy, "entropy");
  return s;
}

absl::Status ValidateId(absl::string_view id, absl::string_view field) {
  if (id.empty()) return absl::InvalidArgumentError(absl::StrCat(field, " is empty"));
  if (static_cast<int64_t>(id.size()) > kMaxIdBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " is ", id.size(), " bytes long; at most ", kMaxIdBytes));
  }
  for (char c : id) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, " \"", absl::CEscape(id), "\" holds a control character"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<ComputeSpec> ComputeSpecFromHeader(const v1::ComputeHeader& header,
                                                  const HeadSpec& head,
                                                  const ComputeLimits& limits) {
  ComputeSpec spec;
  if (header.num_tokens() <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_tokens = ", header.num_tokens(), " must be at least 1"));
  }
  if (header.num_tokens() > limits.max_request_tokens) {
    return absl::ResourceExhaustedError(
        absl::StrCat("num_tokens = ", header.num_tokens(),
                     " exceeds --max-request-tokens=", limits.max_request_tokens));
  }
  spec.num_tokens = header.num_tokens();
  // Without it, hidden of the wrong width only shows as rows that never add up.
  if (header.hidden_size() != 0 && header.hidden_size() != head.hidden_size) {
    return absl::InvalidArgumentError(absl::StrCat("hidden_size = ", header.hidden_size(),
                                                   " but the head's hidden_size is ",
                                                   head.hidden_size));
  }
  auto dtype = DTypeFromProto(header.hidden_dtype(), "hidden_dtype");
  if (!dtype.ok()) return dtype.status();
  spec.hidden_dtype = *dtype;

  spec.ignore_index = header.has_ignore_index() ? header.ignore_index() : -100;
  int64_t want_target_bytes = spec.num_tokens * static_cast<int64_t>(sizeof(int32_t));
  if (static_cast<int64_t>(header.targets().size()) != want_target_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("targets has ", header.targets().size(),
                                                   " bytes; expected ", want_target_bytes,
                                                   " (num_tokens ", spec.num_tokens, " x int32)"));
  }
  spec.targets.resize(spec.num_tokens);
  std::memcpy(spec.targets.data(), header.targets().data(), want_target_bytes);

  FLCE_ASSIGN_OR_RETURN(spec.reduction, ReductionFromProto(header.reduction()));
  FLCE_ASSIGN_OR_RETURN(spec.strategy, StrategyFromProto(header.strategy()));
  // Not part of the engine's spec, but checked with the rest of the header.
  if (header.commit() != v1::COMMIT_ON_COMPLETE && header.commit() != v1::COMMIT_DEFERRED) {
    return UnknownEnumError("commit", v1::CommitMode_descriptor(), header.commit());
  }

  FLCE_ASSIGN_OR_RETURN(spec.options, LossOptionsFromProto(header.options()));
  FLCE_RETURN_IF_ERROR(CheckLossOptions(spec.options));
  using R = OptionRanges;

  auto token_weights =
      PerTokenFloats(header.token_weights(), "token_weights", spec.num_tokens, R::kMaxTokenWeight);
  if (!token_weights.ok()) return token_weights.status();
  spec.token_weights = std::move(*token_weights);
  auto entropy_weights = PerTokenFloats(header.entropy_weights(), "entropy_weights",
                                        spec.num_tokens, R::kMaxTokenWeight);
  if (!entropy_weights.ok()) return entropy_weights.status();
  spec.entropy_weights = std::move(*entropy_weights);

  if (header.policy().loss() != v1::POLICY_LOSS_NONE) {
    if (header.reduction() != v1::REDUCTION_MEAN) {
      return absl::InvalidArgumentError(absl::StrCat(
          "reduction = ", v1::Reduction_Name(header.reduction()),
          " does not apply to a policy objective: policy.aggregation weighs its tokens"));
    }
    FLCE_ASSIGN_OR_RETURN(spec.policy,
                          PolicyFromHeader(header.policy(), spec.targets, spec.ignore_index));
  } else if (header.has_policy() && header.policy().ByteSizeLong() > 0) {
    return absl::InvalidArgumentError(
        "policy has fields set but policy.loss is POLICY_LOSS_NONE: name the objective "
        "(POLICY_LOSS_PPO_CLIP or POLICY_LOSS_CISPO)");
  }
  if (header.preference().loss() != v1::PREFERENCE_LOSS_NONE) {
    if (spec.policy.has_value()) {
      return absl::InvalidArgumentError(
          "policy and preference are both set: a call carries one objective");
    }
    if (header.reduction() != v1::REDUCTION_MEAN) {
      return absl::InvalidArgumentError(absl::StrCat(
          "reduction = ", v1::Reduction_Name(header.reduction()),
          " does not apply to a preference objective: its loss is a mean over pairs"));
    }
    FLCE_ASSIGN_OR_RETURN(spec.preference, PreferenceFromHeader(header.preference(), spec.targets,
                                                                spec.ignore_index));
  } else if (header.has_preference() && header.preference().ByteSizeLong() > 0) {
    return absl::InvalidArgumentError(
        "preference has fields set but preference.loss is PREFERENCE_LOSS_NONE: name the "
        "objective (e.g. PREFERENCE_LOSS_DPO_SIGMOID)");
  }

  const v1::OutputSelection& out = header.outputs();
  spec.outputs.grad_input = out.has_grad_input() ? out.grad_input() : !out.forward_only();
  spec.outputs.per_token_loss = out.per_token_loss();
  spec.outputs.logprob = out.logprob();
  spec.outputs.entropy = out.entropy();
  spec.outputs.accuracy = out.accuracy();
  spec.deterministic = header.deterministic();
  spec.chunk_tokens = header.chunk_tokens();
  // The engines' contract (targets in range, chunk_tokens >= 0 among it), before any work.
  FLCE_RETURN_IF_ERROR(ValidateComputeSpec(head, spec));
  return spec;
}

absl::StatusOr<HeadSpec> HeadSpecFromUpload(const v1::UploadHeadHeader& header) {
  absl::Status id = ValidateId(header.head_id(), "head_id");
  if (!id.ok()) return id;
  HeadSpec spec;
  if (header.vocab_size() <= 0 || header.hidden_size() <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("vocab_size = ", header.vocab_size(),
                                                   " and hidden_size = ", header.hidden_size(),
                                                   " must both be at least 1"));
  }
  // V x H x 4 bytes must fit an int64 with room to spare.
  if (header.vocab_size() > (int64_t{1} << 31) || header.hidden_size() > (int64_t{1} << 20)) {
    return absl::InvalidArgumentError(absl::StrCat("vocab_size = ", header.vocab_size(),
                                                   " x hidden_size = ", header.hidden_size(),
                                                   " is beyond any head flce can hold"));
  }
  spec.vocab_size = header.vocab_size();
  spec.hidden_size = header.hidden_size();
  auto dtype = DTypeFromProto(header.dtype(), "dtype");
  if (!dtype.ok()) return dtype.status();
  spec.dtype = *dtype;
  spec.has_bias = header.has_bias();
  return spec;
}

absl::StatusOr<int64_t> RowTracker::Accept(int64_t token_offset, int64_t bytes,
                                           int64_t row_bytes) {
  if (bytes <= 0 || bytes % row_bytes != 0) {
    return absl::InvalidArgumentError(absl::StrCat(what_, " chunk at token_offset ", token_offset,
                                                   " has ", bytes,
                                                   " bytes, not a positive multiple of a row's ",
                                                   row_bytes, " bytes (hidden_size x dtype size)"));
  }
  int64_t rows = bytes / row_bytes;
  if (token_offset < 0 || token_offset >= num_tokens_ || rows > num_tokens_ - token_offset) {
    // The end is written out only when it fits an int64: a client picks the offset.
    const std::string end = token_offset > std::numeric_limits<int64_t>::max() - rows
                                ? absl::StrCat(token_offset, " + ", rows)
                                : absl::StrCat(token_offset + rows);
    return absl::InvalidArgumentError(absl::StrCat(what_, " chunk rows [", token_offset, ", ", end,
                                                   ") are outside [0, num_tokens = ", num_tokens_,
                                                   ")"));
  }
  int64_t end = token_offset + rows;
  // The first range starting at or after end cannot overlap; the one before
  // it is the only candidate.
  auto next = ranges_.lower_bound(end);
  if (next != ranges_.begin()) {
    auto prev = std::prev(next);
    if (prev->second > token_offset) {
      return absl::InvalidArgumentError(absl::StrCat(what_, " chunk rows [", token_offset, ", ", end,
                                                     ") overlap rows [", prev->first, ", ",
                                                     prev->second, ") already received"));
    }
  }
  ranges_[token_offset] = end;
  received_ += rows;
  return rows;
}

absl::Status RowTracker::CheckComplete() const {
  if (received_ == num_tokens_) return absl::OkStatus();
  int64_t expect = 0;
  for (const auto& [begin, end] : ranges_) {
    if (begin != expect) break;
    expect = end;
  }
  return absl::InvalidArgumentError(absl::StrCat(what_, " rows missing: received ", received_,
                                                 " of num_tokens = ", num_tokens_,
                                                 "; first missing row ", expect));
}

absl::Status CheckRowsFinite(DType dtype, const void* data, int64_t rows, int64_t hidden_size,
                             int64_t token_offset, absl::string_view what) {
  int64_t bad = FirstNonFinite(dtype, data, rows * hidden_size);
  if (bad < 0) return absl::OkStatus();
  return NonFiniteRowError(what, token_offset + bad / hidden_size, bad % hidden_size);
}

absl::Status NonFiniteRowError(absl::string_view what, int64_t token, int64_t element) {
  return absl::InvalidArgumentError(
      absl::StrCat(what, " holds NaN or Inf at token ", token, " (element ", element, ")"));
}

absl::Status NonFiniteGradInputError(int64_t token, int64_t element) {
  return absl::InvalidArgumentError(absl::StrCat(
      kNonFiniteResult, "grad_input holds NaN or Inf at token ", token, " (element ", element,
      "): nothing landed; the options (temperature, grad_scale, weights) overflow fp32 for this "
      "data"));
}

absl::StatusOr<std::vector<int32_t>> ParseTokenIds(const std::string& bytes, int64_t expected,
                                                   int64_t max_tokens, int64_t vocab_size,
                                                   const char* field) {
  if (bytes.size() % 4 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " holds ", bytes.size(), " bytes, not a multiple of 4 (int32 ids)"));
  }
  const int64_t n = static_cast<int64_t>(bytes.size() / 4);
  if (expected >= 0 && n != expected) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " holds ", n, " ids but num_tokens is ", expected));
  }
  if (n > max_tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " holds ", n, " ids, more than --max-request-tokens=", max_tokens));
  }
  std::vector<int32_t> ids(n);
  std::memcpy(ids.data(), bytes.data(), bytes.size());
  absl::Status in_range = CheckRowIds(ids.data(), n, vocab_size);
  if (!in_range.ok())
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", in_range.message()));
  return ids;
}

}  // namespace flce::server
