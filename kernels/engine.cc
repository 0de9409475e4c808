#include "kernels/engine.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "kernels/device_fingerprint.h"

namespace flce {

absl::Status CheckRowIds(const int32_t* ids, int64_t n, int64_t vocab_size) {
  for (int64_t i = 0; i < n; ++i) {
    if (ids[i] < 0 || ids[i] >= vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("token id ", ids[i], " at index ", i, " is outside [0, ", vocab_size, ")"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<PeerRows> ComputeCall::AddHiddenFromPeer(int64_t, int64_t, const PeerMemory&,
                                                         int64_t) {
  return absl::FailedPreconditionError(
      "this engine cannot read hidden states from another process's device memory (CUDA IPC "
      "needs the CUDA engine)");
}

absl::StatusOr<std::shared_ptr<const PeerMemory>> Engine::OpenPeerMemory(const PeerMemoryHandle&) {
  return absl::FailedPreconditionError(absl::StrCat(
      "the ", info().name,
      " engine cannot open another process's device memory (CUDA IPC needs the CUDA engine)"));
}

absl::Status Engine::ReadPeerMemory(const PeerMemory&, int64_t, int64_t, void*) {
  return absl::FailedPreconditionError(
      absl::StrCat("the ", info().name, " engine has no peer memory to read"));
}

absl::StatusOr<std::shared_ptr<const PeerMemory>> Engine::RegisterHostMemory(void*, int64_t) {
  return absl::FailedPreconditionError(
      absl::StrCat("the ", info().name, " engine has no GPU to page-lock host memory for"));
}

uint64_t DeviceHiddenFingerprint(DType dtype, const void* rows, int64_t n, int64_t hidden_size,
                                 int64_t first_token) {
  const int64_t size = DTypeSize(dtype);
  const char* p = static_cast<const char*>(rows);
  uint64_t total = 0;
  for (int64_t r = 0; r < n; ++r) {
    uint64_t sum = 0;
    for (int64_t j = 0; j < hidden_size; ++j, p += size) {
      uint32_t bits = 0;
      if (size == 2) {
        uint16_t half;
        std::memcpy(&half, p, 2);
        bits = half;
      } else {
        std::memcpy(&bits, p, 4);
      }
      sum += ElementTerm(bits, j);
    }
    total += RowTerm(sum, first_token + r);
  }
  return total;
}

const char* StrategyName(Strategy strategy) {
  switch (strategy) {
    case Strategy::kAuto:
      return "auto";
    case Strategy::kChunked:
      return "chunked";
    case Strategy::kVocabSplit:
      return "vocab_split";
    case Strategy::kFuseMN:
      return "fuse_mn";
    case Strategy::kSeparate:
      return "separate";
    case Strategy::kNaive:
      return "naive";
  }
  return "unknown";
}

}  // namespace flce
