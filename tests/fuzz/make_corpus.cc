// Writes flce_fuzz_compute's seed inputs (fuzz_input.h's format) into a
// directory: valid calls on every fuzz head and dtype, retries and deferred
// commits, the ways a call goes wrong (bad header, chunk first, overlap, NaN,
// no end message, non-UTF-8 id, a client that goes away), headers for the
// validation target and chunk sequences for the row tracker. The committed
// tests/fuzz/corpus is its output:
//   flce_fuzz_make_corpus tests/fuzz/corpus
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "flce/v1/flce.pb.h"
#include "tests/fuzz/fuzz_input.h"

namespace flce::fuzz {
namespace {

constexpr uint8_t kJob = 0, kSpec = 2, kTracker = 3;
constexpr uint8_t kCancelAtEnd = 0x04, kGoneBeforeSent = 0x08, kRoomFailsAt2 = 0x20;
constexpr uint8_t kOtherTenant = 0x40, kDiscardStaged = 0x80;

std::string Bytes(const void* data, size_t size) {
  return std::string(static_cast<const char*>(data), size);
}

struct Call {
  std::string head_id;
  int64_t hidden_size;
  DType dtype;
  int64_t vocab;
};

const Call kF32{"f32", 4, DType::kF32, 11};
const Call kBf16b{"bf16b", 8, DType::kBF16, 33};
const Call kF16{"f16", 3, DType::kF16, 7};

v1::DType WireDType(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return v1::DTYPE_FP32;
    case DType::kF16:
      return v1::DTYPE_FP16;
    case DType::kBF16:
      return v1::DTYPE_BF16;
  }
  return v1::DTYPE_FP32;
}

v1::ComputeHeader Header(const Call& call, const std::string& request_id, int64_t tokens) {
  v1::ComputeHeader h;
  h.set_request_id(request_id);
  h.set_head_id(call.head_id);
  h.set_session_id("s1");
  h.set_num_tokens(tokens);
  h.set_hidden_dtype(WireDType(call.dtype));
  h.set_reduction(v1::REDUCTION_SUM);
  std::vector<int32_t> targets(tokens);
  for (int64_t t = 0; t < tokens; ++t) targets[t] = t % 5 == 4 ? -100 : (t * 7) % call.vocab;
  h.set_targets(Bytes(targets.data(), targets.size() * sizeof(int32_t)));
  return h;
}

std::string HeaderRecord(const v1::ComputeHeader& header) {
  v1::ComputeRequest r;
  *r.mutable_header() = header;
  return r.SerializeAsString();
}

std::string ChunkRecord(const Call& call, int64_t offset, int64_t rows, float nan_at = -1) {
  std::vector<float> values(rows * call.hidden_size);
  for (size_t i = 0; i < values.size(); ++i) {
    values[i] = std::sin(static_cast<float>(offset * call.hidden_size + static_cast<int64_t>(i)));
  }
  if (nan_at >= 0) values[static_cast<size_t>(nan_at)] = std::numeric_limits<float>::quiet_NaN();
  std::string data(values.size() * DTypeSize(call.dtype), '\0');
  FromFloat(call.dtype, values.data(), data.data(), static_cast<int64_t>(values.size()));
  v1::ComputeRequest r;
  r.mutable_hidden()->set_token_offset(offset);
  r.mutable_hidden()->set_data(data);
  return r.SerializeAsString();
}

std::string EndRecord(int64_t tokens) {
  v1::ComputeRequest r;
  r.mutable_end()->set_num_tokens(tokens);
  return r.SerializeAsString();
}

// A whole call: header, chunks of `rows` in reverse order, end.
std::vector<std::string> FullCall(const Call& call, const v1::ComputeHeader& header, int64_t rows) {
  std::vector<std::string> records{HeaderRecord(header)};
  const int64_t tokens = header.num_tokens();
  for (int64_t end = tokens; end > 0; end -= rows) {
    int64_t begin = std::max<int64_t>(0, end - rows);
    records.push_back(ChunkRecord(call, begin, end - begin));
  }
  records.push_back(EndRecord(tokens));
  return records;
}

void Append(std::vector<std::string>& to, const std::vector<std::string>& more) {
  to.insert(to.end(), more.begin(), more.end());
}

bool Write(const std::string& dir, const std::string& name, uint8_t flags,
           const std::vector<std::string>& records) {
  std::ofstream out(dir + "/" + name, std::ios::binary);
  out << EncodeFuzzInput(flags, records);
  return static_cast<bool>(out);
}

std::string Le(uint64_t value, int bytes) {
  std::string out;
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
  return out;
}

bool WriteAll(const std::string& dir) {
  bool ok = true;
  {
    v1::ComputeHeader h = Header(kF32, "r1", 6);
    v1::OutputSelection* o = h.mutable_outputs();
    o->set_per_token_loss(true);
    o->set_logprob(true);
    o->set_entropy(true);
    o->set_accuracy(true);
    ok &= Write(dir, "job_f32_all_outputs", kJob, FullCall(kF32, h, 4));
  }
  {
    v1::ComputeHeader h = Header(kBf16b, "d1", 9);
    h.set_commit(v1::COMMIT_DEFERRED);
    h.set_reduction(v1::REDUCTION_NONE);
    std::vector<float> weights(9, 0.5f);
    h.set_token_weights(Bytes(weights.data(), weights.size() * sizeof(float)));
    h.set_entropy_weights(Bytes(weights.data(), weights.size() * sizeof(float)));
    v1::LossOptions* o = h.mutable_options();
    o->set_label_smoothing(0.1f);
    o->set_z_loss_scale(1e-4f);
    o->set_softcap(30.0f);
    o->set_temperature(0.9f);
    o->set_grad_scale(0.25f);
    h.set_chunk_tokens(2);
    std::vector<std::string> records = FullCall(kBf16b, h, 4);
    records.emplace_back();  // the same call again: a retry, answered from the first outcome
    Append(records, FullCall(kBf16b, h, 3));
    records.emplace_back();
    v1::ComputeHeader on_complete = Header(kBf16b, "c1", 5);
    Append(records, FullCall(kBf16b, on_complete, 5));
    ok &= Write(dir, "job_bf16b_deferred_retry_commit", kJob, records);
    ok &= Write(dir, "job_bf16b_deferred_discard_other_tenant", kDiscardStaged | kOtherTenant,
                FullCall(kBf16b, h, 4));
  }
  {
    v1::ComputeHeader h = Header(kF16, "", 7);
    h.mutable_outputs()->set_forward_only(true);
    h.mutable_outputs()->set_per_token_loss(true);
    h.set_session_id("");
    ok &= Write(dir, "job_f16_forward_only", kJob, FullCall(kF16, h, 2));
  }
  {
    v1::ComputeHeader h = Header(kF32, "big", 512);
    h.set_chunk_tokens(64);
    h.set_strategy(v1::STRATEGY_VOCAB_SPLIT);
    h.set_reduction(v1::REDUCTION_MEAN);
    ok &= Write(dir, "job_f32_512_tokens", kJob, FullCall(kF32, h, 200));
  }
  {
    v1::ComputeHeader h = Header(kF32, "r2", 6);
    h.set_targets(h.targets().substr(4));  // one target short
    ok &= Write(dir, "job_bad_header", kJob, FullCall(kF32, h, 6));
  }
  // header { head_id: "\xff\xfe" }, written by hand: protobuf would not serialize it.
  ok &= Write(dir, "job_non_utf8_head_id", kJob,
              {std::string("\x0a\x04\x12\x02\xff\xfe", 6), ChunkRecord(kF32, 0, 1)});
  {
    v1::ComputeHeader h = Header(kF32, "r3", 4);
    ok &= Write(dir, "job_chunk_before_header", kJob,
                {ChunkRecord(kF32, 0, 4), HeaderRecord(h), EndRecord(4)});
    ok &= Write(dir, "job_overlapping_chunks", kJob,
                {HeaderRecord(h), ChunkRecord(kF32, 0, 3), ChunkRecord(kF32, 2, 2), EndRecord(4)});
    ok &= Write(dir, "job_nan_hidden", kJob,
                {HeaderRecord(h), ChunkRecord(kF32, 0, 4, /*nan_at=*/5), EndRecord(4)});
    ok &= Write(dir, "job_no_end_message", kJob, {HeaderRecord(h), ChunkRecord(kF32, 0, 4)});
    ok &= Write(dir, "job_wrong_end_count", kJob,
                {HeaderRecord(h), ChunkRecord(kF32, 0, 4), EndRecord(5)});
    ok &= Write(dir, "job_cancelled_at_end", kCancelAtEnd,
                {HeaderRecord(h), ChunkRecord(kF32, 0, 4)});
    ok &= Write(dir, "job_gone_before_sent", kGoneBeforeSent, FullCall(kF32, h, 2));
    ok &= Write(dir, "job_gone_while_streaming", kRoomFailsAt2, FullCall(kF32, h, 1));
  }
  {
    std::vector<std::string> records;
    v1::ComputeHeader h = Header(kBf16b, "v1", 3);
    records.push_back(HeaderRecord(h));
    h.set_num_tokens(0);
    records.push_back(HeaderRecord(h));
    h = Header(kF16, "v2", 2);
    h.mutable_options()->set_temperature(std::nanf(""));
    records.push_back(HeaderRecord(h));
    h = Header(kF16, "v3", 2);
    h.mutable_options()->set_label_smoothing(2.0f);
    h.set_chunk_tokens(-1);
    records.push_back(HeaderRecord(h));
    h = Header(kF32, "v4", 2);
    h.set_token_weights(std::string(4, '\0'));
    h.set_hidden_size(5);
    h.set_ignore_index(3);
    records.push_back(HeaderRecord(h));
    v1::UploadHeadHeader upload;
    upload.set_head_id("u1");
    upload.set_vocab_size(int64_t{1} << 31);
    upload.set_hidden_size(4);
    upload.set_dtype(v1::DTYPE_BF16);
    records.push_back(upload.SerializeAsString());
    ok &= Write(dir, "spec_headers", kSpec, records);
  }
  {
    // num_tokens 10, rows of 4 bytes; narrow ops: kind byte (non-zero low bits), int16 offset,
    // int16 bytes; a wide op: kind byte 0, int64 offset, int64 bytes.
    std::string body = std::string("\x09\x03", 2);
    auto narrow = [&](int16_t offset, int16_t bytes) {
      body += '\x01' + Le(static_cast<uint16_t>(offset), 2) + Le(static_cast<uint16_t>(bytes), 2);
    };
    narrow(0, 8);
    narrow(5, 12);
    narrow(1, 8);   // overlaps
    narrow(-1, 4);  // before the start
    narrow(9, 6);   // not whole rows
    body += '\x00' + Le(std::numeric_limits<int64_t>::max(), 8) + Le(4, 8);
    body += '\x00' + Le(8, 8) + Le(static_cast<uint64_t>(std::numeric_limits<int64_t>::min()), 8);
    narrow(2, 12);
    narrow(8, 8);
    std::ofstream out(dir + "/tracker_chunks", std::ios::binary);
    out << static_cast<char>(kTracker) << body;
    ok &= static_cast<bool>(out);
  }
  return ok;
}

}  // namespace
}  // namespace flce::fuzz

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  if (!flce::fuzz::WriteAll(argv[1])) {
    std::fprintf(stderr, "cannot write the corpus into %s\n", argv[1]);
    return 1;
  }
  return 0;
}
