#include "tests/fuzz/validation_targets.h"

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "flce/v1/flce.pb.h"
#include "server/validate/validation.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/fuzz_server.h"

namespace flce::fuzz {
namespace {

bool IsRefusal(const absl::Status& status) {
  return status.code() == absl::StatusCode::kInvalidArgument ||
         status.code() == absl::StatusCode::kResourceExhausted;
}

void CheckId(const std::string& id, const char* field) {
  absl::Status status = server::ValidateId(id, field);
  if (!status.ok()) {
    FUZZ_CHECK(status.code() == absl::StatusCode::kInvalidArgument, status.ToString());
    FUZZ_CHECK(absl::StrContains(status.message(), field), "the error does not name ", field);
    return;
  }
  FUZZ_CHECK(!id.empty() && id.size() <= 256, field, " of ", id.size(), " bytes accepted");
  for (char c : id) {
    FUZZ_CHECK(static_cast<unsigned char>(c) >= 0x20 && c != 0x7f, field,
               " with a control character accepted");
  }
}

void CheckSpec(const v1::ComputeHeader& header, const HeadSpec& head) {
  absl::StatusOr<ComputeSpec> spec =
      server::ComputeSpecFromHeader(header, head, server::ComputeLimits{kFuzzMaxTokens});
  if (!spec.ok()) {
    FUZZ_CHECK(IsRefusal(spec.status()), spec.status().ToString());
    FUZZ_CHECK(!spec.status().message().empty(), "a refusal without a message");
    return;
  }
  const int64_t n = spec->num_tokens;
  FUZZ_CHECK(n >= 1 && n <= kFuzzMaxTokens, "num_tokens ", n, " accepted");
  FUZZ_CHECK(n == header.num_tokens(), "num_tokens changed");
  FUZZ_CHECK(header.hidden_size() == 0 || header.hidden_size() == head.hidden_size, "hidden_size ",
             header.hidden_size(), " accepted for H = ", head.hidden_size);
  FUZZ_CHECK(static_cast<int64_t>(spec->targets.size()) == n, "targets size");
  for (int32_t y : spec->targets) {
    FUZZ_CHECK(y == spec->ignore_index || (y >= 0 && y < head.vocab_size), "target ", y,
               " accepted for V = ", head.vocab_size);
  }
  const LossOptions& o = spec->options;
  FUZZ_CHECK(
      std::isfinite(o.label_smoothing) && o.label_smoothing >= 0.0f && o.label_smoothing <= 1.0f,
      "label_smoothing ", o.label_smoothing);
  FUZZ_CHECK(std::isfinite(o.z_loss_scale) && o.z_loss_scale >= 0.0f, "z_loss_scale ",
             o.z_loss_scale);
  FUZZ_CHECK(std::isfinite(o.softcap) && o.softcap >= 0.0f, "softcap ", o.softcap);
  FUZZ_CHECK(std::isfinite(o.temperature) && o.temperature > 0.0f, "temperature ", o.temperature);
  FUZZ_CHECK(std::isfinite(o.grad_scale), "grad_scale ", o.grad_scale);
  for (const std::vector<float>* weights : {&spec->token_weights, &spec->entropy_weights}) {
    FUZZ_CHECK(weights->empty() || static_cast<int64_t>(weights->size()) == n,
               "per-token weights of size ", weights->size(), " for ", n, " tokens");
    for (float w : *weights) FUZZ_CHECK(std::isfinite(w), "per-token weight ", w);
  }
  FUZZ_CHECK(spec->chunk_tokens >= 0, "chunk_tokens ", spec->chunk_tokens);
  FUZZ_CHECK(spec->grad_out == nullptr, "the spec names a gradient buffer");
}

void CheckUpload(absl::string_view bytes) {
  v1::UploadHeadHeader header;
  if (!header.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) return;
  absl::StatusOr<HeadSpec> spec = server::HeadSpecFromUpload(header);
  if (!spec.ok()) {
    FUZZ_CHECK(IsRefusal(spec.status()), spec.status().ToString());
    return;
  }
  FUZZ_CHECK(spec->vocab_size >= 1 && spec->vocab_size <= (int64_t{1} << 31), "V ",
             spec->vocab_size);
  FUZZ_CHECK(spec->hidden_size >= 1 && spec->hidden_size <= (int64_t{1} << 20), "H ",
             spec->hidden_size);
  FUZZ_CHECK(server::ValidateId(header.head_id(), "head_id").ok(), "bad head_id accepted");
}

// Little-endian integers from the front of `in`, zero past its end.
class Reader {
 public:
  explicit Reader(absl::string_view in) : in_(in) {}
  bool empty() const { return in_.empty(); }
  uint64_t Take(size_t bytes) {
    uint64_t value = 0;
    for (size_t i = 0; i < bytes; ++i) {
      uint64_t byte = in_.empty() ? 0 : static_cast<uint8_t>(in_[0]);
      if (!in_.empty()) in_.remove_prefix(1);
      value |= byte << (8 * i);
    }
    return value;
  }

 private:
  absl::string_view in_;
};

}  // namespace

void RunComputeSpecChecks(const FuzzInput& input) {
  for (absl::string_view record : input.records) {
    CheckUpload(record);
    v1::ComputeRequest request;
    if (!request.ParseFromArray(record.data(), static_cast<int>(record.size()))) continue;
    if (!request.has_header()) continue;
    const v1::ComputeHeader& header = request.header();
    CheckId(header.head_id(), "head_id");
    CheckId(header.session_id(), "session_id");
    for (const FuzzHead& head : FuzzHeads()) CheckSpec(header, head.spec);
  }
}

void RunRowTrackerChecks(const FuzzInput& input) {
  Reader in(input.body);
  const int64_t num_tokens = 1 + static_cast<int64_t>(in.Take(1));  // 1..256
  const int64_t row_bytes = 1 + static_cast<int64_t>(in.Take(1) % 16);
  server::RowTracker tracker(num_tokens, "hidden");
  std::vector<bool> have(num_tokens, false);
  int64_t received = 0;
  for (int ops = 0; !in.empty() && ops < 512; ++ops) {
    // Mostly small values near the interesting range; every 8th op full int64s.
    const bool wide = (in.Take(1) & 7) == 0;
    const int64_t offset = wide ? static_cast<int64_t>(in.Take(8))
                                : static_cast<int64_t>(static_cast<int16_t>(in.Take(2)));
    const int64_t bytes = wide ? static_cast<int64_t>(in.Take(8))
                               : static_cast<int64_t>(static_cast<int16_t>(in.Take(2)));
    // The model: a bitmap, and arithmetic that cannot overflow.
    bool fits = bytes > 0 && bytes % row_bytes == 0 && offset >= 0 && offset < num_tokens &&
                bytes / row_bytes <= num_tokens - offset;
    const int64_t rows = fits ? bytes / row_bytes : 0;
    for (int64_t t = offset; fits && t < offset + rows; ++t) fits = !have[t];

    absl::StatusOr<int64_t> accepted = tracker.Accept(offset, bytes, row_bytes);
    FUZZ_CHECK(accepted.ok() == fits, "chunk at ", offset, " of ", bytes, " bytes (rows of ",
               row_bytes, ", num_tokens ", num_tokens, "): tracker says ",
               accepted.status().ToString(), ", model says ", fits ? "fits" : "refused");
    if (!accepted.ok()) {
      FUZZ_CHECK(accepted.status().code() == absl::StatusCode::kInvalidArgument,
                 accepted.status().ToString());
      continue;
    }
    FUZZ_CHECK(*accepted == rows, "rows ", *accepted, " but ", rows, " expected");
    for (int64_t t = offset; t < offset + rows; ++t) have[t] = true;
    received += rows;
    FUZZ_CHECK(tracker.received() == received, "received ", tracker.received(), " but ", received,
               " expected");
  }
  int64_t first_missing = 0;
  while (first_missing < num_tokens && have[first_missing]) ++first_missing;
  absl::Status complete = tracker.CheckComplete();
  FUZZ_CHECK(complete.ok() == (received == num_tokens), complete.ToString());
  if (!complete.ok()) {
    FUZZ_CHECK(
        absl::StrContains(complete.message(), absl::StrCat("first missing row ", first_missing)),
        complete.ToString(), " but the first missing row is ", first_missing);
  }
}

}  // namespace flce::fuzz
