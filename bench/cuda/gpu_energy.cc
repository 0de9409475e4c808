#include "bench/cuda/gpu_energy.h"

#include <cuda_runtime.h>
#include <dlfcn.h>

#include "absl/strings/str_cat.h"

namespace flce::bench {

std::optional<GpuEnergy> GpuEnergy::ForCurrentDevice(std::string* why) {
  // NVML_SUCCESS is 0; the library stays loaded for the process.
  void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    *why = "libnvidia-ml.so.1 not found";
    return std::nullopt;
  }
  using InitFn = int (*)();
  using ByBusFn = int (*)(const char* bus_id, void** device);
  auto init = reinterpret_cast<InitFn>(dlsym(lib, "nvmlInit_v2"));
  auto by_bus = reinterpret_cast<ByBusFn>(dlsym(lib, "nvmlDeviceGetHandleByPciBusId_v2"));
  auto read = reinterpret_cast<ReadFn>(dlsym(lib, "nvmlDeviceGetTotalEnergyConsumption"));
  if (init == nullptr || by_bus == nullptr || read == nullptr) {
    *why = "libnvidia-ml lacks the energy functions";
    return std::nullopt;
  }
  if (const int rc = init(); rc != 0) {
    *why = absl::StrCat("nvmlInit_v2 returned ", rc);
    return std::nullopt;
  }
  // NVML numbers devices its own way: the CUDA device is found by its PCI bus id.
  int cuda_device = 0;
  char bus_id[32] = {};
  if (cudaGetDevice(&cuda_device) != cudaSuccess ||
      cudaDeviceGetPCIBusId(bus_id, sizeof(bus_id), cuda_device) != cudaSuccess) {
    *why = "no PCI bus id for the CUDA device";
    return std::nullopt;
  }
  void* device = nullptr;
  if (const int rc = by_bus(bus_id, &device); rc != 0) {
    *why = absl::StrCat("NVML has no device at ", bus_id, " (", rc, ")");
    return std::nullopt;
  }
  GpuEnergy energy(device, read);
  if (!energy.MilliJoules().has_value()) {
    *why = "this GPU does not report its total energy";
    return std::nullopt;
  }
  return energy;
}

std::optional<uint64_t> GpuEnergy::MilliJoules() const {
  unsigned long long mj = 0;
  if (read_(device_, &mj) != 0) return std::nullopt;
  return static_cast<uint64_t>(mj);
}

}  // namespace flce::bench
