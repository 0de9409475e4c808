// Validation of what clients send, before anything reaches the engine. Every
// error names the field and the value (INVALID_ARGUMENT), or the limit that was
// exceeded (RESOURCE_EXHAUSTED, naming the flag).
//
// Usage:
//   FLCE_ASSIGN_OR_RETURN(ComputeSpec spec,
//                         ComputeSpecFromHeader(header, head->spec(), limits));
//   RowTracker rows(spec.num_tokens, "hidden");
//   FLCE_ASSIGN_OR_RETURN(int64_t n, rows.Accept(chunk.token_offset(), bytes, row_bytes));
#ifndef FLCE_SERVER_VALIDATE_VALIDATION_H_
#define FLCE_SERVER_VALIDATE_VALIDATION_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/dtype.h"
#include "flce/v1/convert.h"  // DTypeFromProto, DTypeToProto
#include "flce/v1/flce.pb.h"
#include "kernels/engine.h"

namespace flce::server {

struct ComputeLimits {
  int64_t max_request_tokens = 1048576;
};

// The engine's spec for a request on a head of shape `head` (grad_out left
// null: the caller decides where gradients go). Checks num_tokens against the
// limit, targets in [0, V) or ignore_index, the loss options' ranges and the
// per-token weights' sizes and values.
absl::StatusOr<ComputeSpec> ComputeSpecFromHeader(const v1::ComputeHeader& header,
                                                  const HeadSpec& head,
                                                  const ComputeLimits& limits);

// Head id, shape and dtype of an upload.
absl::StatusOr<HeadSpec> HeadSpecFromUpload(const v1::UploadHeadHeader& header);

// A head id or session id: non-empty, at most 256 bytes, printable.
absl::Status ValidateId(absl::string_view id, absl::string_view field);
// Free text a call names a file or tensor with: at most max_bytes, no
// control characters (it reaches log lines and error messages).
absl::Status ValidateText(absl::string_view text, absl::string_view field, int64_t max_bytes);
// A request id: empty (the server names the call) or as ValidateId.
absl::Status ValidateRequestId(absl::string_view id, absl::string_view field);

// INVALID_ARGUMENT for a message that follows a stream's end message
// (`end_field`, e.g. "ComputeRequest.end"); `got` says what it was. The end
// message is the last: the call fails and lands nothing.
absl::Status MessageAfterEndError(absl::string_view end_field, absl::string_view got);

// The accepted range of the per-token weights (the loss options': core's
// kLossOptionFields), refused outside it before any work (docs/API.md lists
// them): inside them fp32 holds every intermediate for data of ordinary scale;
// what still overflows is caught on the results (CheckOutputsFinite,
// grad_input, grad_W).
struct OptionRanges {
  static constexpr float kMaxTokenWeight = 1e12f;  // |a_t|, |e_t|
};

// Every refusal of a result that is not finite starts with this, so that a
// client can tell it from bad input (the Python client turns it into an inf
// loss and grad_input, which a GradScaler skips).
inline constexpr char kNonFiniteResult[] = "non-finite result: ";

// INVALID_ARGUMENT naming the first output (loss, z_loss, entropy_sum or a
// per-token value) that is NaN or Inf.
absl::Status CheckOutputsFinite(const ComputeResult& result);

// Which rows of a request have arrived. Chunks may come in any order; they
// must stay inside [0, num_tokens) and never overlap. `what` names the rows in
// every error ("hidden", "gradient"); it must outlive the tracker.
class RowTracker {
 public:
  RowTracker(int64_t num_tokens, const char* what) : num_tokens_(num_tokens), what_(what) {}

  // Checks a chunk of `bytes` bytes at token_offset (rows of row_bytes each)
  // and records it; returns its row count.
  absl::StatusOr<int64_t> Accept(int64_t token_offset, int64_t bytes, int64_t row_bytes);
  int64_t received() const { return received_; }
  // OK once every row arrived, else INVALID_ARGUMENT naming the first gap.
  absl::Status CheckComplete() const;

 private:
  int64_t num_tokens_;
  const char* what_;
  int64_t received_ = 0;
  std::map<int64_t, int64_t> ranges_;  // begin -> end of rows received
};

// Token ids as they travel (int32 little-endian): INVALID_ARGUMENT naming
// `field` for a byte count that is not 4 x expected (expected < 0: any, up to
// max_tokens), more than max_tokens ids, or an id outside [0, vocab_size).
absl::StatusOr<std::vector<int32_t>> ParseTokenIds(const std::string& bytes, int64_t expected,
                                                   int64_t max_tokens, int64_t vocab_size,
                                                   const char* field);

// INVALID_ARGUMENT naming `what` and the first token (and element) holding
// NaN or Inf in `rows` rows of `hidden_size` elements starting at token
// `token_offset`: "<what> holds NaN or Inf at token 7 (element 3)".
absl::Status CheckRowsFinite(DType dtype, const void* data, int64_t rows, int64_t hidden_size,
                             int64_t token_offset, absl::string_view what = "hidden");
// The messages of a non-finite input row (CheckRowsFinite's) and of a
// non-finite grad_input row (found on the host or by the engine).
absl::Status NonFiniteRowError(absl::string_view what, int64_t token, int64_t element);
absl::Status NonFiniteGradInputError(int64_t token, int64_t element);

}  // namespace flce::server

#endif  // FLCE_SERVER_VALIDATE_VALIDATION_H_
