// The CPU engine's resident head: W (and b) widened exactly to fp32 in host
// memory, and the builder that streams the bytes in.
#ifndef FLCE_KERNELS_CPU_CPU_HEAD_H_
#define FLCE_KERNELS_CPU_CPU_HEAD_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/engine.h"

namespace flce::cpu {

class CpuHead : public Head {
 public:
  CpuHead(HeadSpec spec, std::vector<float> weight, std::vector<float> bias);
  const HeadSpec& spec() const override { return spec_; }
  int64_t resident_bytes() const override;
  absl::Status CopyOut(HeadTensor tensor, int64_t begin, int64_t count,
                       void* host_out) const override;
  absl::Status GatherRows(const int32_t* ids, int64_t n, DType out_dtype,
                          void* host_out) const override;
  const float* weight() const { return weight_.data(); }  // V x H
  const float* bias() const { return bias_.empty() ? nullptr : bias_.data(); }
  // For CpuHeadOptimizer only, while no compute call uses the head.
  float* weight_for_update() const { return const_cast<float*>(weight_.data()); }
  float* bias_for_update() const {
    return bias_.empty() ? nullptr : const_cast<float*>(bias_.data());
  }

 private:
  HeadSpec spec_;
  std::vector<float> weight_;
  std::vector<float> bias_;
};

// Which byte ranges of a tensor have been written; writes may overlap.
class ByteCoverage {
 public:
  explicit ByteCoverage(int64_t total) : total_(total) {}
  void Add(int64_t begin, int64_t end);
  // First byte never written, or -1 when all are.
  int64_t FirstMissing() const;

 private:
  int64_t total_;
  std::map<int64_t, int64_t> ranges_;  // begin -> end, disjoint, not touching
};

// Allocated, never initialised: a large block's pages stay unmapped until
// bytes land in them, so a head whose header arrived but whose data did not
// costs address space, not memory.
struct UninitializedBytes {
  explicit UninitializedBytes(int64_t n) : data(new char[n]), size(n) {}
  std::unique_ptr<char[]> data;
  int64_t size;
};

class CpuHeadBuilder : public HeadBuilder {
 public:
  static absl::StatusOr<std::unique_ptr<CpuHeadBuilder>> Create(const HeadSpec& spec);
  absl::Status WriteWeight(int64_t byte_offset, const void* data, int64_t bytes) override;
  absl::Status WriteBias(int64_t byte_offset, const void* data, int64_t bytes) override;
  absl::StatusOr<std::shared_ptr<const Head>> Finish() override;

 private:
  explicit CpuHeadBuilder(const HeadSpec& spec);
  absl::Status Write(const char* what, UninitializedBytes& buffer, ByteCoverage& coverage,
                     int64_t byte_offset, const void* data, int64_t bytes);

  HeadSpec spec_;
  UninitializedBytes weight_bytes_;
  UninitializedBytes bias_bytes_;
  ByteCoverage weight_coverage_;
  ByteCoverage bias_coverage_;
  bool finished_ = false;
};

}  // namespace flce::cpu

#endif  // FLCE_KERNELS_CPU_CPU_HEAD_H_
