#include "kernels/cuda/sharded/sharded_objects.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace flce::cuda {

VocabShards VocabShards::Split(int64_t vocab, int shards) {
  const int64_t per = std::max<int64_t>(4, ((vocab + shards - 1) / shards + 3) / 4 * 4);
  VocabShards out;
  for (int s = 0; s <= shards; ++s) out.begin.push_back(std::min(vocab, s * per));
  out.begin[shards] = vocab;
  return out;
}

int VocabShards::ShardOf(int64_t row) const {
  const auto it = std::upper_bound(begin.begin(), begin.end() - 1, row);
  return static_cast<int>(it - begin.begin()) - 1;
}

absl::Status VocabShards::ForEachPiece(int64_t unit, int64_t first, int64_t n,
                                       const PieceFn& fn) const {
  int64_t done = 0;
  while (done < n) {
    const int64_t at = first + done;
    const int s = ShardOf(at / unit);
    const int64_t end = begin[s + 1] * unit;
    const int64_t take = std::min(n - done, end - at);
    FLCE_RETURN_IF_ERROR(fn(s, at - begin[s] * unit, take, done));
    done += take;
  }
  return absl::OkStatus();
}

HeadSpec ShardSpec(const HeadSpec& spec, const VocabShards& shards, int s) {
  HeadSpec out = spec;
  out.vocab_size = shards.rows(s);
  return out;
}

namespace {

// Elements per vocabulary row, and in all, of the weight or the bias.
int64_t RowElements(const HeadSpec& spec, HeadTensor tensor) {
  return tensor == HeadTensor::kWeight ? spec.hidden_size : 1;
}
int64_t TensorElements(const HeadSpec& spec, HeadTensor tensor) {
  if (tensor == HeadTensor::kBias && !spec.has_bias) return 0;
  return spec.vocab_size * RowElements(spec, tensor);
}

// ids split by shard (local ids, and where each came from), in the order given.
struct RoutedIds {
  std::vector<std::vector<int32_t>> local;
  std::vector<std::vector<int64_t>> index;
};

RoutedIds RouteIds(const VocabShards& shards, const int32_t* ids, int64_t n) {
  RoutedIds r;
  r.local.resize(shards.count());
  r.index.resize(shards.count());
  for (int64_t i = 0; i < n; ++i) {
    const int s = shards.ShardOf(ids[i]);
    r.local[s].push_back(static_cast<int32_t>(ids[i] - shards.begin[s]));
    r.index[s].push_back(i);
  }
  return r;
}

}  // namespace

// --- ShardedHead ----------------------------------------------------------

ShardedHead::ShardedHead(HeadSpec spec, VocabShards shards,
                         std::vector<std::shared_ptr<const CudaHead>> parts)
    : spec_(spec), shards_(std::move(shards)), parts_(std::move(parts)) {}

int64_t ShardedHead::resident_bytes() const {
  int64_t total = 0;
  for (const auto& p : parts_) total += p != nullptr ? p->resident_bytes() : 0;
  return total;
}

absl::Status ShardedHead::CopyOut(HeadTensor tensor, int64_t begin, int64_t count,
                                  void* host_out) const {
  FLCE_RETURN_IF_ERROR(
      CheckElementRange(HeadTensorName(tensor), begin, count, TensorElements(spec_, tensor)));
  const int64_t size = DTypeSize(spec_.dtype);
  char* out = static_cast<char*>(host_out);
  return shards_.ForEachPiece(RowElements(spec_, tensor), begin, count,
                              [&](int s, int64_t at, int64_t n, int64_t done) {
                                return parts_[s]->CopyOut(tensor, at, n, out + done * size);
                              });
}

absl::Status ShardedHead::GatherRows(const int32_t* ids, int64_t n, DType out_dtype,
                                     void* host_out) const {
  FLCE_RETURN_IF_ERROR(CheckRowIds(ids, n, spec_.vocab_size));
  const RoutedIds routed = RouteIds(shards_, ids, n);
  const int64_t row_bytes = spec_.hidden_size * DTypeSize(out_dtype);
  std::string rows;
  for (int s = 0; s < shards_.count(); ++s) {
    const auto& local = routed.local[s];
    if (local.empty()) continue;
    rows.resize(local.size() * row_bytes);
    FLCE_RETURN_IF_ERROR(parts_[s]->GatherRows(local.data(), static_cast<int64_t>(local.size()),
                                               out_dtype, rows.data()));
    for (size_t k = 0; k < local.size(); ++k) {
      std::memcpy(static_cast<char*>(host_out) + routed.index[s][k] * row_bytes,
                  rows.data() + k * row_bytes, row_bytes);
    }
  }
  return absl::OkStatus();
}

// --- ShardedHeadBuilder ---------------------------------------------------

ShardedHeadBuilder::ShardedHeadBuilder(HeadSpec spec, VocabShards shards,
                                       std::vector<std::unique_ptr<HeadBuilder>> parts)
    : spec_(spec), shards_(std::move(shards)), parts_(std::move(parts)) {}

absl::Status ShardedHeadBuilder::Write(bool bias, int64_t byte_offset, const void* data,
                                       int64_t bytes) {
  if (bias && !spec_.has_bias) return absl::InvalidArgumentError("head has no bias");
  const int64_t es = DTypeSize(spec_.dtype);
  const int64_t row_bytes = bias ? es : spec_.hidden_size * es;
  const int64_t total = spec_.vocab_size * row_bytes;
  if (byte_offset < 0 || bytes < 0 || byte_offset > total - bytes) {
    return absl::InvalidArgumentError(absl::StrCat(bias ? "bias" : "weight", " bytes [",
                                                   byte_offset, ", ", byte_offset + bytes,
                                                   ") outside [0, ", total, ")"));
  }
  const char* in = static_cast<const char*>(data);
  // Bytes, not elements: an upload's pieces may split an element.
  return shards_.ForEachPiece(row_bytes, byte_offset, bytes,
                              [&](int s, int64_t at, int64_t n, int64_t done) {
                                return bias ? parts_[s]->WriteBias(at, in + done, n)
                                            : parts_[s]->WriteWeight(at, in + done, n);
                              });
}

absl::Status ShardedHeadBuilder::WriteWeight(int64_t byte_offset, const void* data,
                                             int64_t bytes) {
  return Write(false, byte_offset, data, bytes);
}

absl::Status ShardedHeadBuilder::WriteBias(int64_t byte_offset, const void* data, int64_t bytes) {
  return Write(true, byte_offset, data, bytes);
}

absl::StatusOr<std::shared_ptr<const Head>> ShardedHeadBuilder::Finish() {
  std::vector<std::shared_ptr<const CudaHead>> heads(parts_.size());
  for (size_t s = 0; s < parts_.size(); ++s) {
    if (parts_[s] == nullptr) continue;
    absl::StatusOr<std::shared_ptr<const Head>> head = parts_[s]->Finish();
    if (!head.ok()) {
      // Name the whole head's rows, not the shard's.
      return absl::Status(head.status().code(),
                          absl::StrCat(head.status().message(), " (vocabulary rows [",
                                       shards_.begin[s], ", ", shards_.begin[s + 1], "))"));
    }
    heads[s] = std::dynamic_pointer_cast<const CudaHead>(*head);
  }
  return std::shared_ptr<const Head>(
      std::make_shared<ShardedHead>(spec_, shards_, std::move(heads)));
}

// --- ShardedGradBuffer ----------------------------------------------------

ShardedGradBuffer::ShardedGradBuffer(HeadSpec spec, VocabShards shards,
                                     std::vector<std::unique_ptr<CudaGradBuffer>> parts)
    : spec_(spec), shards_(std::move(shards)), parts_(std::move(parts)) {}

int64_t ShardedGradBuffer::bytes() const {
  int64_t total = 0;
  for (const auto& p : parts_) total += p != nullptr ? p->bytes() : 0;
  return total;
}

absl::StatusOr<const ShardedGradBuffer*> ShardedGradBuffer::SameLayout(const GradBuffer& other,
                                                                       const char* op) const {
  const auto* o = dynamic_cast<const ShardedGradBuffer*>(&other);
  if (o == nullptr || o->shards_.begin != shards_.begin ||
      o->spec_.hidden_size != spec_.hidden_size || o->spec_.has_bias != spec_.has_bias) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": the other buffer is not a sharded gradient of the same shape"));
  }
  return o;
}

absl::Status ShardedGradBuffer::Zero() {
  for (auto& p : parts_) {
    if (p != nullptr) FLCE_RETURN_IF_ERROR(p->Zero());
  }
  return absl::OkStatus();
}

absl::Status ShardedGradBuffer::AddScaled(const GradBuffer& other, float scale) {
  FLCE_ASSIGN_OR_RETURN(const ShardedGradBuffer* o, SameLayout(other, "AddScaled"));
  for (size_t s = 0; s < parts_.size(); ++s) {
    if (parts_[s] != nullptr) FLCE_RETURN_IF_ERROR(parts_[s]->AddScaled(*o->parts_[s], scale));
  }
  return absl::OkStatus();
}

absl::StatusOr<FiniteCheck> ShardedGradBuffer::ScaleAndAdd(float scale, const GradBuffer& base) {
  FLCE_ASSIGN_OR_RETURN(const ShardedGradBuffer* b, SameLayout(base, "ScaleAndAdd"));
  FiniteCheck all;
  for (size_t s = 0; s < parts_.size(); ++s) {
    if (parts_[s] == nullptr) continue;
    FLCE_ASSIGN_OR_RETURN(const FiniteCheck c, parts_[s]->ScaleAndAdd(scale, *b->parts_[s]));
    all.contribution_finite = all.contribution_finite && c.contribution_finite;
    all.sum_finite = all.sum_finite && c.sum_finite;
  }
  return all;
}

absl::StatusOr<bool> ShardedGradBuffer::AllFinite() const {
  for (const auto& p : parts_) {
    if (p == nullptr) continue;
    FLCE_ASSIGN_OR_RETURN(const bool finite, p->AllFinite());
    if (!finite) return false;
  }
  return true;
}

absl::StatusOr<GradNorms> ShardedGradBuffer::SquaredNorms() const {
  GradNorms total;
  for (const auto& p : parts_) {
    if (p == nullptr) continue;
    FLCE_ASSIGN_OR_RETURN(const GradNorms n, p->SquaredNorms());
    total.weight_sq += n.weight_sq;
    total.bias_sq += n.bias_sq;
  }
  return total;
}

absl::Status ShardedGradBuffer::ScatterAddRows(const int32_t* ids, int64_t n, const void* rows,
                                               DType dtype, bool deterministic) {
  FLCE_RETURN_IF_ERROR(CheckRowIds(ids, n, spec_.vocab_size));
  const RoutedIds routed = RouteIds(shards_, ids, n);
  const int64_t row_bytes = spec_.hidden_size * DTypeSize(dtype);
  std::string mine;
  for (int s = 0; s < shards_.count(); ++s) {
    const auto& local = routed.local[s];
    if (local.empty()) continue;
    mine.resize(local.size() * row_bytes);
    for (size_t k = 0; k < local.size(); ++k) {
      std::memcpy(mine.data() + k * row_bytes,
                  static_cast<const char*>(rows) + routed.index[s][k] * row_bytes, row_bytes);
    }
    FLCE_RETURN_IF_ERROR(parts_[s]->ScatterAddRows(
        local.data(), static_cast<int64_t>(local.size()), mine.data(), dtype, deterministic));
  }
  return absl::OkStatus();
}

absl::Status ShardedGradBuffer::CopyWeightRows(int64_t row_begin, int64_t rows, DType out_dtype,
                                               void* host_out) const {
  if (row_begin < 0 || rows < 0 || row_begin + rows > spec_.vocab_size) {
    return absl::OutOfRangeError(absl::StrCat("gradient rows [", row_begin, ", ", row_begin + rows,
                                              ") outside [0, ", spec_.vocab_size, ")"));
  }
  const int64_t row_bytes = spec_.hidden_size * DTypeSize(out_dtype);
  return shards_.ForEachPiece(1, row_begin, rows, [&](int s, int64_t at, int64_t n, int64_t done) {
    return parts_[s]->CopyWeightRows(at, n, out_dtype,
                                     static_cast<char*>(host_out) + done * row_bytes);
  });
}

absl::Status ShardedGradBuffer::CopyBias(int64_t begin, int64_t count, DType out_dtype,
                                         void* host_out) const {
  if (!spec_.has_bias) return absl::FailedPreconditionError("gradient buffer has no bias");
  if (begin < 0 || count < 0 || begin + count > spec_.vocab_size) {
    return absl::OutOfRangeError(absl::StrCat("bias gradient [", begin, ", ", begin + count,
                                              ") outside [0, ", spec_.vocab_size, ")"));
  }
  const int64_t size = DTypeSize(out_dtype);
  return shards_.ForEachPiece(1, begin, count, [&](int s, int64_t at, int64_t n, int64_t done) {
    return parts_[s]->CopyBias(at, n, out_dtype, static_cast<char*>(host_out) + done * size);
  });
}

// --- ShardedOptimizer -----------------------------------------------------

ShardedOptimizer::ShardedOptimizer(HeadSpec spec, VocabShards shards,
                                   std::vector<std::unique_ptr<CudaHeadOptimizer>> parts)
    : spec_(spec), shards_(std::move(shards)), parts_(std::move(parts)) {}

int64_t ShardedOptimizer::state_bytes() const {
  int64_t total = 0;
  for (const auto& p : parts_) total += p != nullptr ? p->state_bytes() : 0;
  return total;
}

absl::StatusOr<StepResult> ShardedOptimizer::Step(const GradBuffer& grad,
                                                  const StepParams& params) {
  const auto* g = dynamic_cast<const ShardedGradBuffer*>(&grad);
  if (g == nullptr || g->shards().begin != shards_.begin) {
    return absl::InvalidArgumentError(
        "Step: the gradient is not a sharded buffer of this head's layout");
  }
  StepResult worst = StepResult::kApplied;
  for (size_t s = 0; s < parts_.size(); ++s) {
    if (parts_[s] == nullptr) continue;
    FLCE_ASSIGN_OR_RETURN(const StepResult r, parts_[s]->CheckStep(*g->part(s), params));
    if (r == StepResult::kNonFiniteGradient) return r;
    if (r != StepResult::kApplied) worst = r;
  }
  if (worst != StepResult::kApplied) return worst;
  for (size_t s = 0; s < parts_.size(); ++s) {
    if (parts_[s] != nullptr) FLCE_RETURN_IF_ERROR(parts_[s]->ApplyStep(*g->part(s), params));
  }
  return StepResult::kApplied;
}

absl::Status ShardedOptimizer::ForEachElementPiece(HeadTensor group, int64_t begin, int64_t count,
                                                   const VocabShards::PieceFn& fn) const {
  FLCE_RETURN_IF_ERROR(
      CheckElementRange(HeadTensorName(group), begin, count, TensorElements(spec_, group)));
  return shards_.ForEachPiece(RowElements(spec_, group), begin, count, fn);
}

absl::Status ShardedOptimizer::ReadState(HeadTensor group, OptimizerTensor tensor, int64_t begin,
                                         int64_t count, float* host_out) const {
  if (count == 0) return parts_[0]->ReadState(group, tensor, 0, 0, host_out);
  return ForEachElementPiece(group, begin, count, [&](int s, int64_t at, int64_t n, int64_t done) {
    return parts_[s]->ReadState(group, tensor, at, n, host_out + done);
  });
}

absl::Status ShardedOptimizer::WriteState(HeadTensor group, OptimizerTensor tensor, int64_t begin,
                                          int64_t count, const float* host) {
  if (count == 0) return parts_[0]->WriteState(group, tensor, 0, 0, host);
  return ForEachElementPiece(group, begin, count, [&](int s, int64_t at, int64_t n, int64_t done) {
    return parts_[s]->WriteState(group, tensor, at, n, host + done);
  });
}

void ShardedOptimizer::set_steps(int64_t steps) {
  for (auto& p : parts_) {
    if (p != nullptr) p->set_steps(steps);
  }
}

}  // namespace flce::cuda
