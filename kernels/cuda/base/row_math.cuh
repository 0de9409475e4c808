// Device-side MATH.md per element and per row: the logit transform (bias,
// softcap, temperature), the online max / sum-exp state and its merge, the
// row finalisation (LSE, loss, logprob, entropy) and dlogits of one column.
// Shared by every row kernel so that all strategies compute the same numbers.
#ifndef FLCE_KERNELS_CUDA_BASE_ROW_MATH_CUH_
#define FLCE_KERNELS_CUDA_BASE_ROW_MATH_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cfloat>
#include <climits>

#include "kernels/cuda/base/row_types.h"

namespace flce::cuda {

__device__ __forceinline__ float ToFloat(float v) { return v; }
__device__ __forceinline__ float ToFloat(__half v) { return __half2float(v); }
__device__ __forceinline__ float ToFloat(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__device__ __forceinline__ T FromFloat(float v);
template <>
__device__ __forceinline__ float FromFloat<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __half FromFloat<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// Per-launch constants derived once per thread: reciprocals instead of a
// division per element (the row kernels are arithmetic-bound at small H).
struct RowConsts {
  float inv_temperature;
  float inv_softcap;  // 0 = no softcap
  float eps_over_v;
  bool identity;  // no softcap and temperature 1: z = r
};

__device__ __forceinline__ RowConsts MakeConsts(const LossParams& p) {
  RowConsts k;
  k.inv_temperature = 1.0f / p.temperature;
  k.inv_softcap = p.softcap > 0.0f ? 1.0f / p.softcap : 0.0f;
  k.eps_over_v = p.label_smoothing / static_cast<float>(p.vocab);
  k.identity = !(p.softcap > 0.0f) && p.temperature == 1.0f;
  return k;
}

// Raw logit r (bias already added) -> z = (c tanh(r/c)) / tau.
__device__ __forceinline__ float TransformLogit(float r, const LossParams& p, const RowConsts& k) {
  if (k.identity) return r;
  float u = p.softcap > 0.0f ? p.softcap * tanhf(r * k.inv_softcap) : r;
  return u * k.inv_temperature;
}

__device__ __forceinline__ float TransformLogit(float r, const LossParams& p) {
  return TransformLogit(r, p, MakeConsts(p));
}

__device__ __forceinline__ RowState EmptyState() {
  RowState st;
  st.m = -INFINITY;
  st.s = 0.0f;
  st.sez = 0.0f;
  st.sum_z = 0.0f;
  st.zy = 0.0f;
  st.amax_value = -INFINITY;
  st.amax_index = INT_MAX;
  st.pad = 0;
  return st;
}

// Adds column j with value z. Columns must come in increasing j per state
// for the argmax tie rule (lowest index) to hold without a compare on index.
__device__ __forceinline__ void PushColumn(RowState& st, float z, int32_t j, int32_t y) {
  if (z > st.m) {
    // Rescale to the new max; an empty state (m = -inf) has nothing to keep.
    const float f = st.s > 0.0f ? __expf(st.m - z) : 0.0f;
    st.sez = st.s > 0.0f ? f * (st.sez + (st.m - z) * st.s) : 0.0f;
    st.s = st.s * f + 1.0f;
    st.m = z;
  } else {
    float e = __expf(z - st.m);
    st.s += e;
    st.sez += e * (z - st.m);
  }
  st.sum_z += z;
  if (j == y) st.zy = z;
  if (z > st.amax_value) {
    st.amax_value = z;
    st.amax_index = j;
  }
}

__device__ __forceinline__ RowState MergeStates(const RowState& a, const RowState& b) {
  RowState out;
  out.m = fmaxf(a.m, b.m);
  float fa = a.s > 0.0f ? expf(a.m - out.m) : 0.0f;
  float fb = b.s > 0.0f ? expf(b.m - out.m) : 0.0f;
  float sa = a.s > 0.0f ? fa * (a.sez + (a.m - out.m) * a.s) : 0.0f;
  float sb = b.s > 0.0f ? fb * (b.sez + (b.m - out.m) * b.s) : 0.0f;
  out.s = a.s * fa + b.s * fb;
  out.sez = sa + sb;
  out.sum_z = a.sum_z + b.sum_z;
  out.zy = a.zy + b.zy;  // only the state that saw the target holds a non-zero
  bool take_b =
      b.amax_value > a.amax_value || (b.amax_value == a.amax_value && b.amax_index < a.amax_index);
  out.amax_value = take_b ? b.amax_value : a.amax_value;
  out.amax_index = take_b ? b.amax_index : a.amax_index;
  out.pad = 0;
  return out;
}

// The warp's sum of v, in every lane (a fixed butterfly: the same on every run).
__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

__device__ __forceinline__ RowState ShuffleXor(const RowState& st, int lane_mask) {
  RowState o;
  o.m = __shfl_xor_sync(0xffffffffu, st.m, lane_mask);
  o.s = __shfl_xor_sync(0xffffffffu, st.s, lane_mask);
  o.sez = __shfl_xor_sync(0xffffffffu, st.sez, lane_mask);
  o.sum_z = __shfl_xor_sync(0xffffffffu, st.sum_z, lane_mask);
  o.zy = __shfl_xor_sync(0xffffffffu, st.zy, lane_mask);
  o.amax_value = __shfl_xor_sync(0xffffffffu, st.amax_value, lane_mask);
  o.amax_index = __shfl_xor_sync(0xffffffffu, st.amax_index, lane_mask);
  o.pad = 0;
  return o;
}

// Fixed-order tree over the block: deterministic. `scratch` holds one state
// per warp. The result is valid in every thread. Ends with a barrier.
template <int kThreads>
__device__ __forceinline__ RowState BlockReduceState(RowState st, RowState* scratch) {
  constexpr int kWarps = kThreads / 32;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    RowState other = ShuffleXor(st, off);
    // Lower lanes hold lower columns: keep the lower side first.
    st = (lane & off) ? MergeStates(other, st) : MergeStates(st, other);
  }
  if (lane == 0) scratch[warp] = st;
  __syncthreads();
  RowState total = scratch[0];
#pragma unroll
  for (int w = 1; w < kWarps; ++w) total = MergeStates(total, scratch[w]);
  __syncthreads();
  return total;
}

// Row finalisation: LSE, the per-row outputs and what the gradient pass needs.
__device__ __forceinline__ RowGrad FinishRow(const RowState& st, const RowInputs& in, int64_t row,
                                             const LossParams& p, RowOutputs out) {
  RowGrad g;
  const int32_t y = in.target[row];
  const float a = in.token_weight[row];
  const bool valid = y >= 0;
  const float log_s = logf(st.s);
  const float lse = st.m + log_s;
  const float mean_shift = st.sez / st.s;  // sum_j p_j (z_j - m)
  const float entropy = log_s - mean_shift;
  // lse - z_y and lse - mean(z) written around the max: no cancellation when
  // p_y is near 1.
  const float nll = (st.m - st.zy) + log_s;
  const float smooth = (st.m - st.sum_z / static_cast<float>(p.vocab)) + log_s;
  const float zl = p.z_loss_scale * lse * lse;
  float loss = (1.0f - p.label_smoothing) * nll + p.label_smoothing * smooth + zl;
  float coef_loss = valid ? p.grad_scale * a : 0.0f;
  if (p.has_policy) {
    // No smoothing and no z-loss come with an objective, so l_t = -logp_t:
    // weighing its gradient by -w_t dL_t/dlogp_t gives dL_t/dz.
    loss = 0.0f;
    coef_loss = 0.0f;
    PolicyTokenTermsT<float> terms;
    const bool counts = valid && a != 0.0f;
    if (counts) {
      const float ref = in.ref_logp != nullptr ? in.ref_logp[row] : 0.0f;
      terms = EvaluatePolicyTokenT<float>(p.policy, -nll, in.old_logp[row], in.advantage[row], ref);
      loss = terms.loss;
      coef_loss = -p.grad_scale * a * terms.dloss_dlogp;
    }
    if (out.ratio) out.ratio[row] = counts ? terms.ratio : 0.0f;
    if (out.log_ratio) out.log_ratio[row] = counts ? terms.log_ratio : 0.0f;
    if (out.kl) out.kl[row] = counts ? terms.kl : 0.0f;
    if (out.policy_flags) {
      out.policy_flags[row] = (terms.clipped_low ? kPolicyClippedLow : 0) |
                              (terms.clipped_high ? kPolicyClippedHigh : 0) |
                              (terms.dual_clipped ? kPolicyDualClipped : 0);
    }
  }
  if (out.loss) out.loss[row] = valid ? loss : 0.0f;
  if (out.z_loss) out.z_loss[row] = valid ? zl : 0.0f;
  if (out.logprob) out.logprob[row] = valid ? -nll : 0.0f;
  if (out.entropy) out.entropy[row] = entropy;
  if (out.argmax) out.argmax[row] = st.amax_index;
  g.m = st.m;
  g.lse = lse;
  g.mean_shift = mean_shift;
  g.logprob = valid ? -nll : 0.0f;
  g.coef_loss = coef_loss;
  g.coef_entropy = p.grad_scale * in.entropy_weight[row];
  g.target = y;
  g.pad = 0;
  return g;
}

// dz for column j (j < V) from its probability and z_j - m (the latter only
// read when the row has an entropy weight).
__device__ __forceinline__ float ProbGrad(float prob, float z_minus_m, int32_t j, const RowGrad& g,
                                          const LossParams& p, const RowConsts& k) {
  const float eps_v = k.eps_over_v;
  const float zfac = 2.0f * p.z_loss_scale * g.lse;
  float dl;
  if (j == g.target) {
    // p_y (1 + 2 s LSE) - (1 - eps): (1-eps)(p_y - 1) via expm1 keeps the
    // small difference when p_y is near 1.
    dl = (1.0f - p.label_smoothing) * expm1f(g.logprob) + prob * (p.label_smoothing + zfac) - eps_v;
  } else {
    dl = prob * (1.0f + zfac) - eps_v;
  }
  float dz = g.coef_loss * dl;
  if (g.coef_entropy != 0.0f) dz -= g.coef_entropy * prob * (z_minus_m - g.mean_shift);
  return dz;
}

// dr for column j (j < V) given its transformed logit z.
__device__ __forceinline__ float ColumnGrad(float z, int32_t j, const RowGrad& g,
                                            const LossParams& p, const RowConsts& k) {
  // exp2 with a pre-scaled argument: one MUFU op; relative error ~1e-6 for
  // the arguments that matter (z - LSE >= -20 or so).
  const float prob = __expf(z - g.lse);
  const float dz = ProbGrad(prob, z - g.m, j, g, p, k);
  if (k.identity) return dz;
  float dr = dz * k.inv_temperature;
  if (p.softcap > 0.0f) {
    const float t = z * p.temperature * k.inv_softcap;  // u / c = tanh(r / c)
    dr *= 1.0f - t * t;
  }
  return dr;
}

__device__ __forceinline__ float ColumnGrad(float z, int32_t j, const RowGrad& g,
                                            const LossParams& p) {
  return ColumnGrad(z, j, g, p, MakeConsts(p));
}

}  // namespace flce::cuda

#endif  // FLCE_KERNELS_CUDA_BASE_ROW_MATH_CUH_
