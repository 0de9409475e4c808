// The plugin's one exported symbol (kernels/engine_factory.h): the server
// dlopen()s libflce_cuda.so and calls it to create the CUDA engine.
#include "kernels/cuda/cuda_engine.h"
#include "kernels/engine_factory.h"

extern "C" flce::Engine* flce_cuda_plugin_create(const flce::EngineConfig* config,
                                                 absl::Status* status) {
  flce::EngineConfig defaults;
  absl::StatusOr<std::unique_ptr<flce::cuda::CudaEngine>> engine =
      flce::cuda::CudaEngine::Create(config != nullptr ? *config : defaults);
  if (!engine.ok()) {
    if (status != nullptr) *status = engine.status();
    return nullptr;
  }
  if (status != nullptr) *status = absl::OkStatus();
  return engine->release();
}
