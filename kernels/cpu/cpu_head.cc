#include "kernels/cpu/cpu_head.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "kernels/cpu/host_memory.h"

namespace flce::cpu {

CpuHead::CpuHead(HeadSpec spec, std::vector<float> weight, std::vector<float> bias)
    : spec_(spec), weight_(std::move(weight)), bias_(std::move(bias)) {}

int64_t CpuHead::resident_bytes() const {
  return static_cast<int64_t>((weight_.size() + bias_.size()) * sizeof(float));
}

absl::Status CpuHead::CopyOut(HeadTensor tensor, int64_t begin, int64_t count,
                              void* host_out) const {
  const std::vector<float>& values = tensor == HeadTensor::kWeight ? weight_ : bias_;
  FLCE_RETURN_IF_ERROR(
      CheckElementRange(HeadTensorName(tensor), begin, count, static_cast<int64_t>(values.size())));
  // The values are the head's dtype widened: narrowing them back is exact.
  FromFloat(spec_.dtype, values.data() + begin, host_out, count);
  return absl::OkStatus();
}

absl::Status CpuHead::GatherRows(const int32_t* ids, int64_t n, DType out_dtype,
                                 void* host_out) const {
  FLCE_RETURN_IF_ERROR(CheckRowIds(ids, n, spec_.vocab_size));
  if (out_dtype != DType::kF32 && out_dtype != spec_.dtype) {
    return absl::InvalidArgumentError(absl::StrCat("rows are gathered as ", DTypeName(spec_.dtype),
                                                   " or fp32, not ", DTypeName(out_dtype)));
  }
  const int64_t h = spec_.hidden_size;
  const int64_t row_bytes = h * DTypeSize(out_dtype);
  for (int64_t i = 0; i < n; ++i) {
    FromFloat(out_dtype, weight_.data() + ids[i] * h, static_cast<char*>(host_out) + i * row_bytes,
              h);
  }
  return absl::OkStatus();
}

void ByteCoverage::Add(int64_t begin, int64_t end) {
  if (begin >= end) return;
  auto it = ranges_.upper_bound(begin);
  if (it != ranges_.begin()) {
    auto prev = std::prev(it);
    if (prev->second >= begin) {
      begin = prev->first;
      end = std::max(end, prev->second);
      it = ranges_.erase(prev);
    }
  }
  while (it != ranges_.end() && it->first <= end) {
    end = std::max(end, it->second);
    it = ranges_.erase(it);
  }
  ranges_[begin] = end;
}

int64_t ByteCoverage::FirstMissing() const {
  if (total_ == 0) return -1;
  if (ranges_.empty() || ranges_.begin()->first > 0) return 0;
  const int64_t end = ranges_.begin()->second;
  return end >= total_ ? -1 : end;
}

absl::StatusOr<std::unique_ptr<CpuHeadBuilder>> CpuHeadBuilder::Create(const HeadSpec& spec) {
  if (spec.vocab_size <= 0 || spec.hidden_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("head shape ", spec.vocab_size, " x ", spec.hidden_size, " must be positive"));
  }
  if (spec.vocab_size > int64_t{1} << 31 || spec.hidden_size > int64_t{1} << 31) {
    return absl::InvalidArgumentError("head dimensions must fit in 32 bits (BLAS indices)");
  }
  // At its peak a build holds the bytes as sent and the fp32 copy Finish makes.
  FLCE_ASSIGN_OR_RETURN(int64_t elements, HostBytes("head", {spec.vocab_size, spec.hidden_size}));
  FLCE_ASSIGN_OR_RETURN(int64_t raw,
                        HostBytes("head", {elements + spec.vocab_size, DTypeSize(spec.dtype)}));
  FLCE_ASSIGN_OR_RETURN(int64_t widened, HostBytes("head", {elements + spec.vocab_size, 4}));
  if (raw > INT64_MAX - widened) {
    return absl::ResourceExhaustedError("head: the size does not fit in 64 bits");
  }
  const std::string what = absl::StrCat("a V=", spec.vocab_size, " H=", spec.hidden_size, " head");
  FLCE_RETURN_IF_ERROR(CheckHostBytes(what.c_str(), raw + widened));
  std::unique_ptr<CpuHeadBuilder> builder;
  FLCE_RETURN_IF_ERROR(
      TryAllocate(what.c_str(), raw, [&] { builder.reset(new CpuHeadBuilder(spec)); }));
  return builder;
}

CpuHeadBuilder::CpuHeadBuilder(const HeadSpec& spec)
    : spec_(spec),
      weight_bytes_(spec.vocab_size * spec.hidden_size * DTypeSize(spec.dtype)),
      bias_bytes_(spec.has_bias ? spec.vocab_size * DTypeSize(spec.dtype) : 0),
      weight_coverage_(weight_bytes_.size),
      bias_coverage_(bias_bytes_.size) {}

absl::Status CpuHeadBuilder::Write(const char* what, UninitializedBytes& buffer,
                                   ByteCoverage& coverage, int64_t byte_offset, const void* data,
                                   int64_t bytes) {
  if (finished_) return absl::FailedPreconditionError("head builder already finished");
  const int64_t total = buffer.size;
  if (byte_offset < 0 || bytes < 0 || byte_offset > total || bytes > total - byte_offset) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " bytes [", byte_offset, ", ", byte_offset + bytes, ") outside [0, ", total, ")"));
  }
  if (bytes > 0 && data == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(what, " data is null"));
  }
  if (bytes > 0) std::memcpy(buffer.data.get() + byte_offset, data, bytes);
  coverage.Add(byte_offset, byte_offset + bytes);
  return absl::OkStatus();
}

absl::Status CpuHeadBuilder::WriteWeight(int64_t byte_offset, const void* data, int64_t bytes) {
  return Write("weight", weight_bytes_, weight_coverage_, byte_offset, data, bytes);
}

absl::Status CpuHeadBuilder::WriteBias(int64_t byte_offset, const void* data, int64_t bytes) {
  if (!spec_.has_bias) return absl::FailedPreconditionError("head has no bias");
  return Write("bias", bias_bytes_, bias_coverage_, byte_offset, data, bytes);
}

absl::StatusOr<std::shared_ptr<const Head>> CpuHeadBuilder::Finish() {
  if (finished_) return absl::FailedPreconditionError("head builder already finished");
  if (int64_t missing = weight_coverage_.FirstMissing(); missing >= 0) {
    return absl::FailedPreconditionError(absl::StrCat("weight incomplete: byte ", missing, " of ",
                                                      weight_bytes_.size, " never written"));
  }
  if (int64_t missing = bias_coverage_.FirstMissing(); missing >= 0) {
    return absl::FailedPreconditionError(absl::StrCat("bias incomplete: byte ", missing, " of ",
                                                      bias_bytes_.size, " never written"));
  }
  // A non-finite weight would make every logit of its row meaningless (and
  // the row pass assumes finite logits): refuse the head instead.
  const int64_t count = spec_.vocab_size * spec_.hidden_size;
  if (int64_t bad = FirstNonFinite(spec_.dtype, weight_bytes_.data.get(), count); bad >= 0) {
    return absl::InvalidArgumentError(absl::StrCat("weight element (", bad / spec_.hidden_size,
                                                   ", ", bad % spec_.hidden_size,
                                                   ") is not finite (NaN or Inf)"));
  }
  if (spec_.has_bias) {
    if (int64_t bad = FirstNonFinite(spec_.dtype, bias_bytes_.data.get(), spec_.vocab_size);
        bad >= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("bias element ", bad, " is not finite (NaN or Inf)"));
    }
  }
  std::vector<float> weight;
  FLCE_RETURN_IF_ERROR(
      TryAllocate("the head's fp32 weight", count * 4, [&] { weight.resize(count); }));
  finished_ = true;
  ToFloat(spec_.dtype, weight_bytes_.data.get(), weight.data(), count);
  weight_bytes_.data.reset();
  std::vector<float> bias;
  if (spec_.has_bias) {
    bias.resize(spec_.vocab_size);
    ToFloat(spec_.dtype, bias_bytes_.data.get(), bias.data(), spec_.vocab_size);
  }
  return std::shared_ptr<const Head>(
      std::make_shared<CpuHead>(spec_, std::move(weight), std::move(bias)));
}

}  // namespace flce::cpu
