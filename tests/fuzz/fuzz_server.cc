#include "tests/fuzz/fuzz_server.h"

#include <cstdint>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "kernels/engine_factory.h"
#include "tests/fuzz/fuzz_check.h"

namespace flce::fuzz {
namespace {

// Values in [-1, 1] from a fixed integer hash: the same head on every run,
// and logits of moderate hidden states stay moderate.
std::vector<float> FixedValues(int64_t count, uint32_t salt) {
  std::vector<float> values(count);
  for (int64_t i = 0; i < count; ++i) {
    uint32_t h = (static_cast<uint32_t>(i) + salt) * 2654435761u;
    values[i] = static_cast<float>(h % 2001u) / 1000.0f - 1.0f;
  }
  return values;
}

std::shared_ptr<const Head> BuildHead(Engine& engine, const HeadSpec& spec) {
  absl::StatusOr<std::unique_ptr<HeadBuilder>> builder = engine.BeginHead(spec);
  FUZZ_CHECK(builder.ok(), builder.status().ToString());
  auto write = [&](int64_t count, uint32_t salt, bool bias) {
    std::vector<float> values = FixedValues(count, salt);
    std::vector<char> bytes(count * DTypeSize(spec.dtype));
    FromFloat(spec.dtype, values.data(), bytes.data(), count);
    absl::Status written =
        bias ? (*builder)->WriteBias(0, bytes.data(), static_cast<int64_t>(bytes.size()))
             : (*builder)->WriteWeight(0, bytes.data(), static_cast<int64_t>(bytes.size()));
    FUZZ_CHECK(written.ok(), written.ToString());
  };
  write(spec.vocab_size * spec.hidden_size, 1, false);
  if (spec.has_bias) write(spec.vocab_size, 2, true);
  absl::StatusOr<std::shared_ptr<const Head>> head = (*builder)->Finish();
  FUZZ_CHECK(head.ok(), head.status().ToString());
  return *head;
}

}  // namespace

const std::vector<FuzzHead>& FuzzHeads() {
  static const auto* heads = new std::vector<FuzzHead>{
      {"f32", HeadSpec{11, 4, DType::kF32, false}},
      {"bf16b", HeadSpec{33, 8, DType::kBF16, true}},
      {"f16", HeadSpec{7, 3, DType::kF16, false}},
  };
  return *heads;
}

FuzzServer& FuzzServer::Get() {
  static FuzzServer* server = new FuzzServer();
  return *server;
}

FuzzServer::FuzzServer() {
  EngineConfig config;
  config.threads = 1;  // repeatable, and the fuzzer runs one input at a time
  config.workspace_bytes = int64_t{8} << 20;
  absl::StatusOr<std::unique_ptr<Engine>> engine = CreateCpuEngine(config);
  FUZZ_CHECK(engine.ok(), engine.status().ToString());
  engine_ = std::move(*engine);
  for (const FuzzHead& head : FuzzHeads()) {
    absl::StatusOr<server::HeadEntry> put =
        heads_.Put(/*owner=*/"", head.id, BuildHead(*engine_, head.spec), "fuzz");
    FUZZ_CHECK(put.ok(), put.status().ToString());
  }
}

FuzzContext::FuzzContext() {
  FuzzServer& server = FuzzServer::Get();
  server::SessionLimits limits;
  limits.max_sessions = 4;
  limits.max_pending = 2;
  sessions = std::make_unique<server::SessionStore>(&server.engine(), limits);
  // No byte bound: a call that waited for staging memory would wait forever
  // here, since the fake client never goes away by itself.
  staging = std::make_unique<server::StagingBudget>(/*capacity_bytes=*/0, /*max_waiting=*/4);
  ctx.config.max_request_tokens = kFuzzMaxTokens;
  ctx.config.max_sessions = limits.max_sessions;
  ctx.config.max_pending = limits.max_pending;
  // The smallest messages the server accepts: long calls split their replies.
  ctx.config.max_message_bytes = int64_t{64} << 10;
  ctx.config.max_response_bytes = int64_t{64} << 10;
  ctx.engine = &server.engine();
  ctx.heads = &server.heads();
  ctx.sessions = sessions.get();
  ctx.staging = staging.get();
  ctx.workers = &workers;
  ctx.instance_id = "fuzz";
  ctx.version = "fuzz";
}

}  // namespace flce::fuzz
