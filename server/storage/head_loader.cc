#include "server/storage/head_loader.h"

#include <limits.h>
#include <stdlib.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "server/storage/safetensors.h"

namespace flce::server {
namespace {

// Rows per block streamed into the engine (~8 MiB of fp32 at H=4096).
constexpr int64_t kBlockBytes = int64_t{8} << 20;

absl::StatusOr<std::string> RealPath(const std::string& path) {
  char buf[PATH_MAX];
  if (realpath(path.c_str(), buf) == nullptr) {
    int err = errno;
    std::string why = absl::StrCat(path, ": ", std::strerror(err));
    if (err == ENOENT || err == ENOTDIR) return absl::NotFoundError(why);
    if (err == EACCES) return absl::PermissionDeniedError(why);
    return absl::InvalidArgumentError(why);
  }
  return std::string(buf);
}

// Streams `elements` values of `tensor` (file dtype `from`) into `write` as
// `to`, a block at a time.
absl::Status StreamTensor(const SafetensorsFile& file, const SafetensorsTensor& tensor, DType from,
                          DType to, int64_t elements,
                          const std::function<absl::Status(int64_t, const void*, int64_t)>& write) {
  int64_t block = std::max<int64_t>(1, kBlockBytes / 4);
  std::string raw;
  std::vector<float> values;
  std::string converted;
  for (int64_t begin = 0; begin < elements; begin += block) {
    int64_t n = std::min(block, elements - begin);
    raw.resize(n * DTypeSize(from));
    FLCE_RETURN_IF_ERROR(
        file.Read(tensor, begin * DTypeSize(from), n * DTypeSize(from), raw.data()));
    if (from == to) {
      FLCE_RETURN_IF_ERROR(write(begin * DTypeSize(to), raw.data(), n * DTypeSize(to)));
      continue;
    }
    values.resize(n);
    ToFloat(from, raw.data(), values.data(), n);
    converted.resize(n * DTypeSize(to));
    FromFloat(to, values.data(), converted.data(), n);
    FLCE_RETURN_IF_ERROR(write(begin * DTypeSize(to), converted.data(), n * DTypeSize(to)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> ResolveUnderRoot(const std::string& root, const std::string& path) {
  if (root.empty()) {
    return absl::FailedPreconditionError(
        "loading heads from files is off: the server was started without --head-root");
  }
  if (path.empty()) return absl::InvalidArgumentError("path is empty");
  FLCE_ASSIGN_OR_RETURN(std::string real_root, RealPath(root));
  std::string joined = path.front() == '/' ? path : absl::StrCat(real_root, "/", path);
  absl::StatusOr<std::string> real = RealPath(joined);
  std::string prefix = real_root == "/" ? real_root : absl::StrCat(real_root, "/");
  if (!real.ok()) {
    // A path that cannot be resolved is judged lexically, so that probing
    // outside the root learns nothing about what exists there.
    bool outside =
        (path.front() == '/' && !absl::StartsWith(path, prefix)) || absl::StrContains(path, "..");
    if (outside) {
      return absl::PermissionDeniedError(
          absl::StrCat("path \"", path, "\" is outside --head-root"));
    }
    return absl::NotFoundError(absl::StrCat("path \"", path, "\" not found under --head-root"));
  }
  if (!absl::StartsWith(*real, prefix)) {
    // Where it resolves to is not said: the caller may not learn the layout
    // outside the root.
    return absl::PermissionDeniedError(
        absl::StrCat("path \"", path, "\" resolves outside --head-root"));
  }
  return *real;
}

absl::StatusOr<std::shared_ptr<const Head>> LoadSafetensorsHead(
    Engine& engine, const std::string& path, const std::string& weight_tensor,
    const std::string& bias_tensor, std::optional<DType> dtype, const HeadCheck& check) {
  FLCE_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::Open(path));
  if (weight_tensor.empty()) return absl::InvalidArgumentError("weight_tensor is empty");
  FLCE_ASSIGN_OR_RETURN(const SafetensorsTensor* weight, file.Find(weight_tensor));
  if (weight->shape.size() != 2 || weight->shape[0] <= 0 || weight->shape[1] <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor \"", weight_tensor, "\" has ", weight->shape.size(),
                     " dimensions; a head's weight is [vocab_size, hidden_size]"));
  }
  FLCE_ASSIGN_OR_RETURN(DType weight_dtype, DTypeFromSafetensors(weight->dtype));
  HeadSpec spec;
  spec.vocab_size = weight->shape[0];
  spec.hidden_size = weight->shape[1];
  spec.dtype = dtype.value_or(weight_dtype);
  const SafetensorsTensor* bias = nullptr;
  DType bias_dtype = spec.dtype;
  if (!bias_tensor.empty()) {
    FLCE_ASSIGN_OR_RETURN(bias, file.Find(bias_tensor));
    if (bias->shape.size() != 1 || bias->shape[0] != spec.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("tensor \"", bias_tensor, "\" is not a [",
                                                     spec.vocab_size, "] bias vector"));
    }
    FLCE_ASSIGN_OR_RETURN(bias_dtype, DTypeFromSafetensors(bias->dtype));
    spec.has_bias = true;
  }
  // Limits first: a head that cannot be kept is refused before it is read.
  if (check) FLCE_RETURN_IF_ERROR(check(spec));
  FLCE_ASSIGN_OR_RETURN(std::unique_ptr<HeadBuilder> builder, engine.BeginHead(spec));
  FLCE_RETURN_IF_ERROR(StreamTensor(file, *weight, weight_dtype, spec.dtype,
                                    spec.vocab_size * spec.hidden_size,
                                    [&](int64_t offset, const void* data, int64_t bytes) {
                                      return builder->WriteWeight(offset, data, bytes);
                                    }));
  if (bias != nullptr) {
    FLCE_RETURN_IF_ERROR(StreamTensor(file, *bias, bias_dtype, spec.dtype, spec.vocab_size,
                                      [&](int64_t offset, const void* data, int64_t bytes) {
                                        return builder->WriteBias(offset, data, bytes);
                                      }));
  }
  return builder->Finish();
}

absl::StatusOr<std::shared_ptr<const Head>> BuildDemoHead(Engine& engine) {
  HeadSpec spec;
  spec.vocab_size = kDemoVocab;
  spec.hidden_size = kDemoHidden;
  spec.dtype = DType::kBF16;
  FLCE_ASSIGN_OR_RETURN(std::unique_ptr<HeadBuilder> builder, engine.BeginHead(spec));
  std::mt19937_64 rng(kDemoSeed);
  std::normal_distribution<float> normal(0.0f, 1.0f / std::sqrt(static_cast<float>(kDemoHidden)));
  constexpr int64_t kRows = 1024;
  std::vector<float> values(kRows * kDemoHidden);
  std::vector<uint16_t> bits(values.size());
  for (int64_t row = 0; row < kDemoVocab; row += kRows) {
    int64_t rows = std::min(kRows, kDemoVocab - row);
    int64_t n = rows * kDemoHidden;
    for (int64_t i = 0; i < n; ++i) values[i] = normal(rng);
    FromFloat(DType::kBF16, values.data(), bits.data(), n);
    FLCE_RETURN_IF_ERROR(builder->WriteWeight(row * kDemoHidden * 2, bits.data(), n * 2));
  }
  return builder->Finish();
}

}  // namespace flce::server
