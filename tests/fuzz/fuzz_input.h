// The byte format of flce_fuzz_compute's inputs, shared by the fuzzer and the
// seed-corpus generator:
//
//   byte 0        flags: bits 0-1 pick the target (FuzzTarget), bits 2-7 are
//                 the target's own (ChannelBehaviour for a Compute call)
//   then records  a 2-byte little-endian length and that many bytes each; a
//                 tail shorter than its length is the last record
//
// For the Compute targets each record is one serialized flce.v1.ComputeRequest
// and an empty record ends a call (the next records are a new call).
#ifndef FLCE_TESTS_FUZZ_FUZZ_INPUT_H_
#define FLCE_TESTS_FUZZ_FUZZ_INPUT_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace flce::fuzz {

enum class FuzzTarget {
  kComputeJob,       // flags & 3 == 0 or 1: ComputeJob over a fake channel
  kComputeSpec,      // 2: ComputeSpecFromHeader and ValidateId on each header
  kRowTracker  // 3: RowTracker against a model (bytes after the flags)
};

struct FuzzInput {
  uint8_t flags = 0;
  absl::string_view body;                  // everything after the flags byte
  std::vector<absl::string_view> records;  // body split into records
};

FuzzTarget TargetOf(uint8_t flags);
FuzzInput ParseFuzzInput(const uint8_t* data, size_t size);
std::string EncodeFuzzInput(uint8_t flags, const std::vector<std::string>& records);

// Records split into calls at empty records; at most max_calls calls.
std::vector<std::vector<absl::string_view>> SplitCalls(
    const std::vector<absl::string_view>& records, size_t max_calls);

}  // namespace flce::fuzz

#endif  // FLCE_TESTS_FUZZ_FUZZ_INPUT_H_
