#include "kernels/engine_factory.h"

#include <dirent.h>
#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace flce {
namespace {

std::string ExecutableDir() {
  std::vector<char> buf(4096);
  ssize_t n = readlink("/proc/self/exe", buf.data(), buf.size() - 1);
  if (n <= 0) return "";
  std::string path(buf.data(), n);
  auto slash = path.rfind('/');
  return slash == std::string::npos ? "" : path.substr(0, slash);
}

std::vector<std::string> PluginCandidates(const std::string& plugin_path) {
  if (!plugin_path.empty()) return {plugin_path};
  if (const char* env = std::getenv("FLCE_CUDA_PLUGIN"); env != nullptr && *env != '\0') {
    return {env};
  }
  std::vector<std::string> out;
  std::string dir = ExecutableDir();
  if (!dir.empty()) {
    out.push_back(absl::StrCat(dir, "/", FLCE_CUDA_PLUGIN_FILE));  // an install, the image
    // The build tree: build/server/flce-server beside build/kernels/cuda/.
    out.push_back(absl::StrCat(dir, "/../kernels/cuda/", FLCE_CUDA_PLUGIN_FILE));
    out.push_back(absl::StrCat(dir, "/../lib/", FLCE_CUDA_PLUGIN_FILE));
  }
  out.push_back(FLCE_CUDA_PLUGIN_FILE);
  return out;
}

}  // namespace

bool NvidiaGpuListed(const std::string& gpus_dir) {
  DIR* dir = opendir(gpus_dir.c_str());
  if (dir == nullptr) return false;
  bool found = false;
  while (dirent* entry = readdir(dir)) {
    if (entry->d_name[0] != '.') {
      found = true;
      break;
    }
  }
  closedir(dir);
  return found;
}

absl::StatusOr<std::unique_ptr<Engine>> LoadCudaEngine(const EngineConfig& config,
                                                       const std::string& plugin_path) {
  std::string errors;
  for (const std::string& candidate : PluginCandidates(plugin_path)) {
    // The plugin stays loaded for the life of the process: engines and the
    // objects they hand out point into it.
    void* handle = dlopen(candidate.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      absl::StrAppend(&errors, errors.empty() ? "" : "; ", dlerror());
      continue;
    }
    auto create = reinterpret_cast<decltype(&flce_cuda_plugin_create)>(
        dlsym(handle, FLCE_CUDA_PLUGIN_SYMBOL));
    if (create == nullptr) {
      return absl::InternalError(
          absl::StrCat(candidate, " has no symbol ", FLCE_CUDA_PLUGIN_SYMBOL));
    }
    absl::Status status;
    Engine* engine = create(&config, &status);
    if (engine == nullptr) {
      return status.ok() ? absl::InternalError("CUDA plugin returned no engine") : status;
    }
    return std::unique_ptr<Engine>(engine);
  }
  return absl::UnavailableError(
      absl::StrCat("CUDA engine plugin ", FLCE_CUDA_PLUGIN_FILE, " not found: ", errors));
}

}  // namespace flce
