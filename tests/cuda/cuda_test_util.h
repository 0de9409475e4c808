// What the CUDA test binaries share: an engine with a given workspace, an
// engine switch set for a scope, and the skip (with the reason) when this machine has no CUDA device, for tests
// of the engine and for tests that launch kernels directly.
#ifndef FLCE_TESTS_CUDA_CUDA_TEST_UTIL_H_
#define FLCE_TESTS_CUDA_CUDA_TEST_UTIL_H_

#include <cuda_runtime.h>

#include <cstdlib>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "kernels/cuda/engine/cuda_engine.h"

namespace flce::test {

inline absl::StatusOr<std::unique_ptr<cuda::CudaEngine>> MakeEngine(int64_t budget_mb = 2048) {
  EngineConfig config;
  config.workspace_bytes = budget_mb << 20;
  return cuda::CudaEngine::Create(config);
}

// An engine switch (FLCE_CUDA_*) set, or unset with a null value, for the
// object's lifetime; what the environment had is restored after, also when
// an assertion leaves the scope early.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) {
      old_ = old;
      had_ = true;
    }
    if (value != nullptr) {
      setenv(name, value, 1);
    } else {
      unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (had_) {
      setenv(name_.c_str(), old_.c_str(), 1);
    } else {
      unsetenv(name_.c_str());
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_;
  std::string old_;
  bool had_ = false;
};

}  // namespace flce::test

// UNAVAILABLE from the engine means no device here: skip; anything else fails.
#define SKIP_WITHOUT_GPU(engine_or)                                         \
  if (!(engine_or).ok()) {                                                  \
    if ((engine_or).status().code() == absl::StatusCode::kUnavailable) {    \
      GTEST_SKIP() << "no CUDA device: " << (engine_or).status().message(); \
    }                                                                       \
    FAIL() << (engine_or).status();                                         \
  }

// For tests that launch kernels themselves (no engine): skip without a device.
#define SKIP_WITHOUT_CUDA_DEVICE()                                                 \
  do {                                                                             \
    int cuda_devices_ = 0;                                                         \
    if (cudaGetDeviceCount(&cuda_devices_) != cudaSuccess || cuda_devices_ == 0) { \
      GTEST_SKIP() << "no CUDA device";                                            \
    }                                                                              \
  } while (0)

#endif  // FLCE_TESTS_CUDA_CUDA_TEST_UTIL_H_
