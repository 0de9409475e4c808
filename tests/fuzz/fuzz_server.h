// The server state the fuzzer drives, wired as FlceServer::Start wires it but
// without gRPC or metrics: the CPU engine (one thread, a small workspace) and
// a registry of small shared heads live for the whole run; each input gets a
// fresh session store and staging budget, so inputs do not depend on each
// other.
#ifndef FLCE_TESTS_FUZZ_FUZZ_SERVER_H_
#define FLCE_TESTS_FUZZ_FUZZ_SERVER_H_

#include <memory>
#include <string>
#include <vector>

#include "kernels/engine.h"
#include "server/base/worker_pool.h"
#include "server/handlers/service_context.h"
#include "server/state/head_registry.h"
#include "server/state/session_store.h"
#include "server/state/staging_budget.h"

namespace flce::fuzz {

struct FuzzHead {
  std::string id;
  HeadSpec spec;
};

// "f32" (V=11, H=4, fp32), "bf16b" (V=33, H=8, bf16, with bias), "f16"
// (V=7, H=3, fp16): odd sizes, every dtype, with and without bias.
const std::vector<FuzzHead>& FuzzHeads();

// Most tokens a fuzzed call may ask for (--max-request-tokens).
inline constexpr int64_t kFuzzMaxTokens = 4096;

class FuzzServer {
 public:
  // Built on first use; aborts if it cannot be (the fuzzer is useless then).
  static FuzzServer& Get();

  Engine& engine() { return *engine_; }
  server::HeadRegistry& heads() { return heads_; }

 private:
  FuzzServer();
  std::unique_ptr<Engine> engine_;
  server::HeadRegistry heads_;
};

// One input's state: a ServiceContext over the shared engine and heads.
struct FuzzContext {
  FuzzContext();
  std::unique_ptr<server::SessionStore> sessions;
  std::unique_ptr<server::StagingBudget> staging;
  server::WorkTracker workers;
  server::ServiceContext ctx;
};

}  // namespace flce::fuzz

#endif  // FLCE_TESTS_FUZZ_FUZZ_SERVER_H_
