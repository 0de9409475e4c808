// The GPU's cumulative energy counter (NVML's total energy consumption, mJ
// since the driver loaded), read through the driver's libnvidia-ml at run
// time so that the bench builds where no driver is installed. Under the
// board's power limit a step's time follows its energy; joules per run next
// to milliseconds tell the two apart.
#ifndef FLCE_BENCH_CUDA_GPU_ENERGY_H_
#define FLCE_BENCH_CUDA_GPU_ENERGY_H_

#include <cstdint>
#include <optional>
#include <string>

namespace flce::bench {

class GpuEnergy {
 public:
  // The counter of the current CUDA device, or nullopt with `why` set (no
  // NVML library, the device not found, or a GPU without the counter).
  static std::optional<GpuEnergy> ForCurrentDevice(std::string* why);

  // Millijoules since the driver loaded; nullopt if the read fails.
  std::optional<uint64_t> MilliJoules() const;

 private:
  using ReadFn = int (*)(void* device, unsigned long long* mj);
  GpuEnergy(void* device, ReadFn read) : device_(device), read_(read) {}
  void* device_;
  ReadFn read_;
};

}  // namespace flce::bench

#endif  // FLCE_BENCH_CUDA_GPU_ENERGY_H_
