// The (engine, strategy) pairs every conformance test runs on, kept in one
// place: add a strategy here and every suite picks it up.
//
// On a GPU host the CUDA cases run against the plugin this tree built, or
// the one FLCE_CUDA_PLUGIN names:
//   FLCE_CUDA_PLUGIN=/path/libflce_cuda.so flce_engine_tests --gtest_filter='*cuda*'
// FLCE_TEST_PRINT_ERRORS=1 prints every comparison's relative errors.
#ifndef FLCE_TESTS_ENGINE_ENGINE_PARAMS_H_
#define FLCE_TESTS_ENGINE_ENGINE_PARAMS_H_

#include <ostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/engine.h"

namespace flce::test {

struct EngineParam {
  std::string engine;  // "cpu" or "cuda"
  Strategy strategy = Strategy::kAuto;
};

std::vector<EngineParam> AllEngineParams();

// "cpu_auto", "cuda_vocab_split": a valid gtest name.
std::string ParamName(const EngineParam& param);
void PrintTo(const EngineParam& param, std::ostream* os);

// The process-wide engine for a name, created on first use (the CUDA plugin is
// loaded once); UNAVAILABLE-style errors say why it cannot run here.
absl::StatusOr<Engine*> SharedEngine(const std::string& name);

// A fresh engine with its own workspace budget (for workspace tests).
absl::StatusOr<std::unique_ptr<Engine>> NewEngine(const std::string& name,
                                                  const EngineConfig& config);

bool IsCpu(const EngineParam& param);

}  // namespace flce::test

#endif  // FLCE_TESTS_ENGINE_ENGINE_PARAMS_H_
