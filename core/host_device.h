// FLCE_HOST_DEVICE: a function the CPU code and the CUDA kernels both call,
// from one source (inline on the host, forced inline on the device).
#ifndef FLCE_CORE_HOST_DEVICE_H_
#define FLCE_CORE_HOST_DEVICE_H_

#if defined(__CUDACC__)
#define FLCE_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define FLCE_HOST_DEVICE inline
#endif

#endif  // FLCE_CORE_HOST_DEVICE_H_
