// The logits-stats path's backward without a dlogits pass (bf16 heads, no
// label smoothing, no entropy weights).
//
// With e_j = exp(z_j - M_t) for a per-row reference M_t chosen before the
// logits exist (the target's logit, x_t . W_y), every dlogit of the row but
// the target's is one scale away from e: dz_j = K_t e_j with
// K_t = g a_t (1 + 2 s LSE_t) exp(M_t - LSE_t). The row finish rewrites the
// single target entry as dz_y / K_t, so that
//   grad_input[t] = K_t (E W)[t]        (row scale after the GEMM), and
//   grad_W       += E^T (K x)           (hidden rows scaled before it),
// and the two backward GEMMs read E as the logits-stats GEMM wrote it. bf16
// holds exp(z - M_t) for any z - M_t in (-87, 88): a row whose LSE lies more
// than 60 nats above M_t (its loss; then some e may exceed e^60, which the
// GEMM caps or, for calls without entropy and accuracy, does not), or that
// needs per-element terms, raises a flag on the device; the chunk then reruns the dlogits-pass path
// (the launches below that take `fallback` read it), with no host round trip.
#ifndef FLCE_KERNELS_CUDA_OPS_ROW_SCALED_BACKWARD_CUH_
#define FLCE_KERNELS_CUDA_OPS_ROW_SCALED_BACKWARD_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "core/dtype.h"
#include "kernels/cuda/base/cuda_status.h"

namespace flce::cuda {

// reference[t] = x_t . W_{y_t} in fp32 (W_0 for ignored tokens, whose rows
// only need to stay finite), and *fallback = 0 for the chunk.
absl::Status LaunchRowReference(DType dtype, const void* x, const void* w, const int32_t* target,
                                int64_t rows, int64_t hidden, float* reference, int32_t* fallback,
                                cudaStream_t stream, DeviceHealth* health);

// out[t, k] = scale[t] * in[t, k], or in[t, k] unscaled once *fallback != 0
// (the chunk took the dlogits-pass path). in: bf16 or fp32; out: any dtype.
// With parts > 1, `in` is that many rows x cols slabs one after another,
// summed in order before the scale.
absl::Status LaunchScaleRows(DType in_dtype, const void* in, DType out_dtype, void* out,
                             int64_t rows, int64_t cols, const float* scale,
                             const int32_t* fallback, cudaStream_t stream, DeviceHealth* health,
                             int parts = 1);

}  // namespace flce::cuda

#endif  // FLCE_KERNELS_CUDA_OPS_ROW_SCALED_BACKWARD_CUH_
