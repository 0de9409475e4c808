#include "tests/fuzz/compute_job_target.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "flce/v1/flce.pb.h"
#include "server/base/status_mapping.h"
#include "server/handlers/compute_job.h"
#include "server/state/auth.h"
#include "server/validate/validation.h"
#include "tests/fuzz/fake_compute_channel.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/fuzz_server.h"

namespace flce::fuzz {
namespace {

constexpr size_t kMaxCallsPerInput = 4;

using SessionKey = std::tuple<std::string, std::string, std::string>;  // tenant, head, session
using Grads = std::map<SessionKey, std::vector<float>>;

std::string Name(const SessionKey& key) {
  return absl::StrCat(std::get<0>(key), "/", std::get<1>(key), "/", std::get<2>(key));
}

// Every session's grad_W (then grad_b) as fp32, each checked finite.
Grads AllGrads(server::SessionStore& store) {
  Grads grads;
  for (const server::SessionSummary& s : store.ListAll()) {
    SessionKey key{s.tenant, s.head_id, s.session_id};
    absl::StatusOr<server::GradSnapshot> snap =
        store.Snapshot(s.tenant, s.head_id, s.session_id, /*reset=*/false, /*request_id=*/"");
    FUZZ_CHECK(snap.ok(), "Snapshot of listed session ", Name(key), ": ", snap.status().ToString());
    const GradBuffer& grad = *snap->grad;
    const int64_t weights = grad.vocab_size() * grad.hidden_size();
    std::vector<float> values(weights + (grad.has_bias() ? grad.vocab_size() : 0));
    absl::Status copied = grad.CopyWeightRows(0, grad.vocab_size(), DType::kF32, values.data());
    FUZZ_CHECK(copied.ok(), copied.ToString());
    if (grad.has_bias()) {
      copied = grad.CopyBias(0, grad.vocab_size(), DType::kF32, values.data() + weights);
      FUZZ_CHECK(copied.ok(), copied.ToString());
    }
    for (size_t i = 0; i < values.size(); ++i) {
      FUZZ_CHECK(std::isfinite(values[i]), "session ", Name(key), " grad element ", i, " is ",
                 values[i]);
    }
    grads.emplace(std::move(key), std::move(values));
  }
  return grads;
}

// What the call asked for, as far as its first message says.
struct CallOutline {
  std::optional<v1::ComputeHeader> header;
  std::optional<HeadSpec> head;     // the head the caller sees under header.head_id
  std::optional<ComputeSpec> spec;  // the header validated against it
  SessionKey session;
};

CallOutline OutlineOf(const std::vector<absl::string_view>& records, const server::Principal& who,
                      server::HeadRegistry& heads) {
  CallOutline outline;
  if (records.empty()) return outline;
  v1::ComputeRequest first;
  if (!first.ParseFromArray(records[0].data(), static_cast<int>(records[0].size())) ||
      !first.has_header()) {
    return outline;
  }
  outline.header = first.header();
  outline.session = {
      who.tenant, outline.header->head_id(),
      outline.header->session_id().empty() ? "default" : outline.header->session_id()};
  absl::StatusOr<server::HeadEntry> head = heads.Get(who.tenant, outline.header->head_id());
  if (!head.ok()) return outline;
  outline.head = head->head->spec();
  absl::StatusOr<ComputeSpec> spec = server::ComputeSpecFromHeader(
      *outline.header, *outline.head, server::ComputeLimits{kFuzzMaxTokens});
  if (spec.ok()) outline.spec = std::move(*spec);
  return outline;
}

// Chunks inside [0, num_tokens), disjoint; returns how many tokens they cover.
int64_t CheckChunks(const std::vector<SentChunk>& chunks, int64_t num_tokens, const char* what) {
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (const SentChunk& c : chunks) {
    FUZZ_CHECK(
        c.num_tokens >= 1 && c.token_offset >= 0 && c.num_tokens <= num_tokens - c.token_offset,
        what, " chunk [", c.token_offset, ", +", c.num_tokens, ") outside [0, ", num_tokens, ")");
    ranges.emplace_back(c.token_offset, c.token_offset + c.num_tokens);
  }
  std::sort(ranges.begin(), ranges.end());
  int64_t covered = 0;
  for (size_t i = 0; i < ranges.size(); ++i) {
    if (i > 0) {
      FUZZ_CHECK(ranges[i].first >= ranges[i - 1].second, what, " chunks overlap at token ",
                 ranges[i].first);
    }
    covered += ranges[i].second - ranges[i].first;
  }
  return covered;
}

void CheckResponses(const CallOutline& call, const SentLog& sent, const absl::Status& status) {
  FUZZ_CHECK(sent.empty == 0, sent.empty, " responses with no content");
  FUZZ_CHECK(sent.after_summary == 0, sent.after_summary, " responses after the summary");
  FUZZ_CHECK(status.ok() == sent.summary.has_value(), "status ", status.ToString(), " but ",
             sent.summary.has_value() ? "a" : "no", " summary was sent");
  if (!call.spec.has_value()) {
    // The header was refused (or never came): nothing may have been computed.
    FUZZ_CHECK(!status.ok(), "a call whose header does not validate succeeded");
    FUZZ_CHECK(sent.grad_input.empty() && sent.token_outputs.empty(),
               "outputs sent for a call whose header does not validate");
    return;
  }
  const ComputeSpec& spec = *call.spec;
  const int64_t row_bytes = call.head->hidden_size * DTypeSize(spec.hidden_dtype);
  for (const SentChunk& c : sent.grad_input) {
    FUZZ_CHECK(c.bytes[0] == c.num_tokens * row_bytes, "grad_input chunk of ", c.num_tokens,
               " tokens has ", c.bytes[0], " bytes");
  }
  int64_t grad_rows = CheckChunks(sent.grad_input, spec.num_tokens, "grad_input");
  if (!spec.outputs.grad_input) FUZZ_CHECK(grad_rows == 0, "grad_input sent though not asked for");
  for (const SentChunk& c : sent.token_outputs) {
    const OutputSelection& want = spec.outputs;
    const int64_t n = c.num_tokens;
    FUZZ_CHECK(c.bytes[0] == (want.per_token_loss ? 4 * n : 0), "loss has ", c.bytes[0], " bytes");
    FUZZ_CHECK(c.bytes[1] == (want.logprob ? 4 * n : 0), "logprob has ", c.bytes[1], " bytes");
    FUZZ_CHECK(c.bytes[2] == (want.entropy ? 4 * n : 0), "entropy has ", c.bytes[2], " bytes");
    FUZZ_CHECK(c.bytes[3] == (want.accuracy ? n : 0), "correct has ", c.bytes[3], " bytes");
  }
  int64_t output_rows = CheckChunks(sent.token_outputs, spec.num_tokens, "token outputs");
  if (!status.ok()) return;

  if (spec.outputs.grad_input) {
    FUZZ_CHECK(grad_rows == spec.num_tokens, "grad_input covers ", grad_rows, " of ",
               spec.num_tokens, " tokens");
  }
  const OutputSelection& want = spec.outputs;
  bool per_token = want.per_token_loss || want.logprob || want.entropy || want.accuracy;
  FUZZ_CHECK(output_rows == (per_token ? spec.num_tokens : 0), "token outputs cover ", output_rows,
             " of ", spec.num_tokens, " tokens");
  const v1::ComputeSummary& summary = *sent.summary;
  FUZZ_CHECK(summary.n_valid() >= 0 && summary.n_valid() <= spec.num_tokens, "n_valid ",
             summary.n_valid());
  FUZZ_CHECK(summary.n_correct() >= 0 && summary.n_correct() <= summary.n_valid(), "n_correct ",
             summary.n_correct());
  FUZZ_CHECK(!(summary.staged() && summary.committed()), "staged and committed at once");
  if (call.header->outputs().forward_only()) {
    FUZZ_CHECK(!summary.staged() && !summary.committed(), "a forward-only call landed a gradient");
  }
}

void CheckStatus(const absl::Status& status) {
  if (status.ok()) return;
  grpc::Status mapped = server::ToGrpcStatus(status);
  FUZZ_CHECK(mapped.error_code() != grpc::StatusCode::INTERNAL &&
                 mapped.error_code() != grpc::StatusCode::UNKNOWN &&
                 mapped.error_code() != grpc::StatusCode::DATA_LOSS,
             "a client's bytes made a server fault: ", status.ToString());
  FUZZ_CHECK(!status.message().empty(), "an error without a message: ", status.ToString());
}

// `landed`: the call committed its own contribution to call.session.
void CheckGradsAfter(const Grads& before, const Grads& after, const absl::Status& status,
                     const CallOutline& call, bool landed) {
  for (const auto& [key, values] : after) {
    auto was = before.find(key);
    if (landed && key == call.session) continue;
    if (was == before.end()) {
      // A session the call created: it may exist, but holds nothing.
      for (float v : values) FUZZ_CHECK(v == 0.0f, "new session ", Name(key), " holds ", v);
    } else {
      FUZZ_CHECK(was->second == values, "a call that landed nothing there changed grad_W of ",
                 Name(key), " (", status.ToString(), ")");
    }
  }
}

}  // namespace

void RunComputeJobs(const FuzzInput& input) {
  ChannelBehaviour behaviour;
  behaviour.cancel_at_end = (input.flags & 0x04) != 0;
  behaviour.gone_before_sent = (input.flags & 0x08) != 0;
  behaviour.fail_room_at = (input.flags >> 4) & 3;
  const server::Principal who =
      (input.flags & 0x40) != 0 ? server::Principal{"t1", false} : server::Principal{"", true};
  const bool discard_staged = (input.flags & 0x80) != 0;
  // Each call's outcome on stderr, for reading a seed or a finding.
  static const bool verbose = std::getenv("FLCE_FUZZ_VERBOSE") != nullptr;

  FuzzContext fc;
  for (const std::vector<absl::string_view>& records :
       SplitCalls(input.records, kMaxCallsPerInput)) {
    CallOutline call = OutlineOf(records, who, *fc.ctx.heads);
    Grads before = AllGrads(*fc.sessions);
    FakeComputeChannel channel(records, behaviour);
    absl::Status status;
    {
      server::RpcScope scope(fc.ctx, "Compute");
      {
        server::ComputeJob job(fc.ctx, &channel, who, &scope);
        status = job.Run();
      }
      scope.Done(server::ToGrpcStatus(status));
    }
    FUZZ_CHECK(fc.ctx.active_calls.load() == 0, fc.ctx.active_calls.load(), " calls in flight");
    CheckStatus(status);
    SentLog sent = channel.sent();
    if (verbose) {
      std::fprintf(stderr, "flce fuzz: call of %zu messages: %s%s\n", records.size(),
                   status.ToString().c_str(),
                   sent.summary.has_value()
                       ? absl::StrCat(" ", sent.summary->ShortDebugString()).c_str()
                       : "");
    }
    CheckResponses(call, sent, status);
    const bool landed = status.ok() && sent.summary->committed() && !sent.summary->replayed();
    CheckGradsAfter(before, AllGrads(*fc.sessions), status, call, landed);

    if (status.ok() && sent.summary->staged() && !sent.summary->replayed()) {
      const auto& [tenant, head, session] = call.session;
      absl::StatusOr<server::CommitResult> commit = fc.sessions->Commit(
          tenant, head, session, call.header->request_id(), /*scale=*/1.0f, discard_staged);
      FUZZ_CHECK(commit.ok(), "Commit of a staged call: ", commit.status().ToString());
    }
  }
  AllGrads(*fc.sessions);  // finite after the last commit too
}

}  // namespace flce::fuzz
