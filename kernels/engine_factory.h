// Creating engines. The CUDA engine lives in a plugin (libflce_cuda.so) that
// the server loads with dlopen(): a process that links cuBLASLt at start-up
// cannot start prometheus-cpp's HTTP exposer (cuBLASLt's ~94 KB static TLS no
// longer fits in civetweb's small worker-thread stacks), while the same
// library loaded later with dlopen() gets dynamic TLS and breaks nothing. It
// also keeps the server binary free of any CUDA dependency.
#ifndef FLCE_KERNELS_ENGINE_FACTORY_H_
#define FLCE_KERNELS_ENGINE_FACTORY_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "kernels/engine.h"

namespace flce {

absl::StatusOr<std::unique_ptr<Engine>> CreateCpuEngine(const EngineConfig& config);

// Loads the CUDA plugin and creates its engine. plugin_path empty: the
// FLCE_CUDA_PLUGIN environment variable, else libflce_cuda.so beside the
// running executable (an install, the image), else in ../kernels/cuda from it
// (the build tree), else in ../lib from it, else the loader's search path.
// UNAVAILABLE when the plugin is missing or no CUDA device is present.
absl::StatusOr<std::unique_ptr<Engine>> LoadCudaEngine(const EngineConfig& config,
                                                       const std::string& plugin_path = "");

// True when the NVIDIA driver lists a GPU (an entry under `gpus_dir`): a host
// where --device auto falling back to the CPU is worth a warning.
bool NvidiaGpuListed(const std::string& gpus_dir = "/proc/driver/nvidia/gpus");

}  // namespace flce

// The plugin's one exported symbol. Returns a new engine, or nullptr with
// *status set. Both sides are built from this tree with the same compiler and
// the same shared Abseil, so C++ types may cross the boundary.
extern "C" flce::Engine* flce_cuda_plugin_create(const flce::EngineConfig* config,
                                                 absl::Status* status);
#define FLCE_CUDA_PLUGIN_SYMBOL "flce_cuda_plugin_create"
#define FLCE_CUDA_PLUGIN_FILE "libflce_cuda.so"

#endif  // FLCE_KERNELS_ENGINE_FACTORY_H_
