#include "tests/fuzz/fuzz_input.h"

#include <algorithm>

namespace flce::fuzz {

FuzzTarget TargetOf(uint8_t flags) {
  switch (flags & 3) {
    case 2:
      return FuzzTarget::kComputeSpec;
    case 3:
      return FuzzTarget::kRowTracker;
    default:
      return FuzzTarget::kComputeJob;
  }
}

FuzzInput ParseFuzzInput(const uint8_t* data, size_t size) {
  FuzzInput input;
  if (size == 0) return input;
  input.flags = data[0];
  input.body = absl::string_view(reinterpret_cast<const char*>(data) + 1, size - 1);
  absl::string_view rest = input.body;
  while (rest.size() >= 2) {
    size_t length =
        static_cast<uint8_t>(rest[0]) | (static_cast<size_t>(static_cast<uint8_t>(rest[1])) << 8);
    rest.remove_prefix(2);
    length = std::min(length, rest.size());
    input.records.push_back(rest.substr(0, length));
    rest.remove_prefix(length);
  }
  return input;
}

std::string EncodeFuzzInput(uint8_t flags, const std::vector<std::string>& records) {
  std::string out(1, static_cast<char>(flags));
  for (const std::string& record : records) {
    size_t length = std::min<size_t>(record.size(), 0xffff);
    out.push_back(static_cast<char>(length & 0xff));
    out.push_back(static_cast<char>(length >> 8));
    out.append(record, 0, length);
  }
  return out;
}

std::vector<std::vector<absl::string_view>> SplitCalls(
    const std::vector<absl::string_view>& records, size_t max_calls) {
  std::vector<std::vector<absl::string_view>> calls(1);
  for (absl::string_view record : records) {
    if (record.empty()) {
      if (calls.size() == max_calls) break;
      calls.emplace_back();
      continue;
    }
    calls.back().push_back(record);
  }
  return calls;
}

}  // namespace flce::fuzz
