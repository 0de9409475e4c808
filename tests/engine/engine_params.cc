#include "tests/engine/engine_params.h"

#include <unistd.h>

#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "kernels/engine_factory.h"

namespace flce::test {
namespace {

// The CUDA engine runs each of these plans; the CPU engine runs one plan for
// every name, so it is tested once with auto and once with a named strategy.
constexpr Strategy kCudaStrategies[] = {Strategy::kChunked,  Strategy::kVocabSplit,
                                        Strategy::kFuseMN,   Strategy::kSeparate,
                                        Strategy::kNaive,    Strategy::kAuto};

// A head split across GPUs runs these (fuse_mn runs vocab_split, naive is
// refused: sharded_engine_test checks both).
constexpr Strategy kShardedStrategies[] = {Strategy::kChunked, Strategy::kVocabSplit,
                                           Strategy::kSeparate, Strategy::kAuto};

// "cuda_shards2": the CUDA engine with every head split in two, both shards
// on GPU 0 (device copies between them: the sharded plan's arithmetic on one
// GPU); "cuda_shards3" in three, uneven.
int ShardCount(const std::string& name) {
  if (name == "cuda_shards2") return 2;
  if (name == "cuda_shards3") return 3;
  return 0;
}

EngineConfig DefaultConfig() {
  EngineConfig config;
  config.workspace_bytes = int64_t{256} << 20;
  return config;
}

}  // namespace

std::vector<EngineParam> AllEngineParams() {
  std::vector<EngineParam> params = {{"cpu", Strategy::kAuto}, {"cpu", Strategy::kVocabSplit}};
  for (Strategy strategy : kCudaStrategies) params.push_back({"cuda", strategy});
  for (const char* sharded : {"cuda_shards2", "cuda_shards3"}) {
    for (Strategy strategy : kShardedStrategies) params.push_back({sharded, strategy});
  }
  return params;
}

std::string ParamName(const EngineParam& param) {
  return absl::StrCat(param.engine, "_", StrategyName(param.strategy));
}

void PrintTo(const EngineParam& param, std::ostream* os) { *os << ParamName(param); }

bool IsCpu(const EngineParam& param) { return param.engine == "cpu"; }

absl::StatusOr<std::unique_ptr<Engine>> NewEngine(const std::string& name,
                                                  const EngineConfig& config) {
  if (name == "cpu") return CreateCpuEngine(config);
  if (name == "cuda" || ShardCount(name) > 0) {
    EngineConfig cuda_config = config;
    cuda_config.devices.assign(ShardCount(name), config.device_ordinal);
    std::string plugin;
#ifdef FLCE_TEST_CUDA_PLUGIN
    const char* env = std::getenv("FLCE_CUDA_PLUGIN");
    if ((env == nullptr || *env == '\0') && access(FLCE_TEST_CUDA_PLUGIN, R_OK) == 0) {
      plugin = FLCE_TEST_CUDA_PLUGIN;
    }
#endif
    return LoadCudaEngine(cuda_config, plugin);
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown engine ", name));
}

absl::StatusOr<Engine*> SharedEngine(const std::string& name) {
  static std::mutex mu;
  static auto* engines = new std::map<std::string, absl::StatusOr<std::unique_ptr<Engine>>>();
  std::lock_guard<std::mutex> lock(mu);
  auto it = engines->find(name);
  if (it == engines->end()) {
    it = engines->emplace(name, NewEngine(name, DefaultConfig())).first;
  }
  if (!it->second.ok()) return it->second.status();
  return it->second->get();
}

}  // namespace flce::test
