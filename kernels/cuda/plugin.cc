// The plugin's one exported symbol (kernels/engine_factory.h): the server
// dlopen()s libflce_cuda.so and calls it to create the CUDA engine.
#include "kernels/cuda/engine/cuda_engine.h"
#include "kernels/cuda/sharded/sharded_engine.h"
#include "kernels/engine_factory.h"

extern "C" flce::Engine* flce_cuda_plugin_create(const flce::EngineConfig* config,
                                                 absl::Status* status) {
  flce::EngineConfig defaults;
  flce::EngineConfig c = config != nullptr ? *config : defaults;
  if (c.all_devices) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count < 1) {
      cudaGetLastError();
      if (status != nullptr) *status = absl::UnavailableError("--gpus all: no CUDA device");
      return nullptr;
    }
    c.devices.clear();
    for (int d = 0; d < count; ++d) c.devices.push_back(d);
  }
  absl::StatusOr<std::unique_ptr<flce::Engine>> engine;
  if (c.devices.size() > 1) {
    engine = flce::cuda::ShardedEngine::Create(c);
  } else {
    flce::EngineConfig one = c;
    if (!c.devices.empty()) one.device_ordinal = c.devices[0];
    engine = flce::cuda::CudaEngine::Create(one);
  }
  if (!engine.ok()) {
    if (status != nullptr) *status = engine.status();
    return nullptr;
  }
  if (status != nullptr) *status = absl::OkStatus();
  return engine->release();
}
