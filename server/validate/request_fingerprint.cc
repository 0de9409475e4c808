#include "server/validate/request_fingerprint.h"

#include <xxhash.h>

#include <string>

#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"

namespace flce::server {
namespace {

// XXH3: stable across runs and builds, unlike std::hash, and fast enough that
// a header with a few hundred KiB of targets costs microseconds (a byte-wise
// FNV-1a took ~0.4 ms per 64k-token header).
uint64_t Hash(const std::string &bytes) { return XXH3_64bits(bytes.data(), bytes.size()); }

}  // namespace

namespace {

uint64_t DeterministicFingerprint(const google::protobuf::Message &message) {
  std::string bytes;
  {
    google::protobuf::io::StringOutputStream out(&bytes);
    google::protobuf::io::CodedOutputStream coded(&out);
    coded.SetSerializationDeterministic(true);
    message.SerializeToCodedStream(&coded);
  }
  return Hash(bytes);
}

}  // namespace

uint64_t EmbedGradFingerprint(const v1::EmbedGradHeader &header) {
  v1::EmbedGradHeader defining = header;
  defining.clear_request_id();
  defining.clear_deterministic();
  defining.clear_expected_head_version();
  return DeterministicFingerprint(defining);
}

uint64_t ComputeFingerprint(const v1::ComputeHeader &header) {
  v1::ComputeHeader defining = header;
  defining.clear_request_id();
  defining.clear_strategy();
  defining.clear_chunk_tokens();
  defining.clear_deterministic();
  defining.clear_outputs();
  defining.clear_expected_head_version();
  defining.clear_hidden_size();  // checked against the head; optional
  // Where hidden is, not what it is: a retry may come through another region
  // (a new Regions stream) or in messages.
  defining.clear_shared();
  defining.clear_messages_reason();  // metrics only
  defining.clear_hidden_pieces();    // how the rows travel, not what they are
  return DeterministicFingerprint(defining);
}

uint64_t HiddenFingerprint(const void *data, int64_t rows, int64_t row_bytes, int64_t first_token) {
  const char *row = static_cast<const char *>(data);
  uint64_t sum = 0;
  for (int64_t r = 0; r < rows; ++r, row += row_bytes) {
    sum += XXH3_64bits_withSeed(row, static_cast<size_t>(row_bytes),
                                static_cast<XXH64_hash_t>(first_token + r));
  }
  return sum;
}

}  // namespace flce::server
