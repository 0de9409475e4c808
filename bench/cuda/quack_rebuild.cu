#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "bench/cuda/quack_rebuild.cuh"

namespace flce::bench {
namespace {

constexpr int kRowThreads = 512;
constexpr int kVector = 8;  // bf16 per 16-byte load

struct MaxSum {
  float m;  // running max
  float s;  // sum of exp(z - m)
};

__device__ __forceinline__ MaxSum Combine(MaxSum a, MaxSum b) {
  const float m = fmaxf(a.m, b.m);
  if (m == -INFINITY) return {m, 0.0f};
  return {m, a.s * __expf(a.m - m) + b.s * __expf(b.m - m)};
}

// One block per token: the row's max and sum (one read), the loss, then the
// row rewritten as (softmax - onehot) * scale in bf16 (a second read, from
// L2), zeros on the padding columns. An ignored token's row becomes zeros.
__global__ void __launch_bounds__(kRowThreads)
    LossAndDlogitsInPlace(__nv_bfloat16* logits, int64_t ld, int32_t vocab, int32_t padded,
                          const int32_t* target, float* loss, float grad_scale) {
  __nv_bfloat16* z = logits + static_cast<int64_t>(blockIdx.x) * ld;
  uint4* vectors = reinterpret_cast<uint4*>(z);
  MaxSum acc{-INFINITY, 0.0f};
  for (int i = threadIdx.x; i * kVector < vocab; i += kRowThreads) {
    uint4 raw = vectors[i];
    const __nv_bfloat16* v = reinterpret_cast<const __nv_bfloat16*>(&raw);
    float f[kVector];
    float m = -INFINITY;
#pragma unroll
    for (int k = 0; k < kVector; ++k) {
      f[k] = i * kVector + k < vocab ? __bfloat162float(v[k]) : -INFINITY;
      m = fmaxf(m, f[k]);
    }
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < kVector; ++k) s += __expf(f[k] - m);
    acc = Combine(acc, {m, s});
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    acc = Combine(acc, {__shfl_xor_sync(0xffffffffu, acc.m, offset),
                        __shfl_xor_sync(0xffffffffu, acc.s, offset)});
  }
  __shared__ MaxSum warps[kRowThreads / 32];
  __shared__ float row_lse;
  __shared__ float row_target_logit;
  if (threadIdx.x % 32 == 0) warps[threadIdx.x / 32] = acc;
  __syncthreads();
  const int32_t y = target[blockIdx.x];
  const bool counted = y >= 0 && y < vocab;
  if (threadIdx.x == 0) {
    MaxSum all = warps[0];
    for (int w = 1; w < kRowThreads / 32; ++w) all = Combine(all, warps[w]);
    row_lse = all.m + logf(all.s);
    row_target_logit = counted ? __bfloat162float(z[y]) : 0.0f;
    loss[blockIdx.x] = counted ? row_lse - row_target_logit : 0.0f;
  }
  __syncthreads();  // z[y] is read before any thread rewrites the row
  const float lse = row_lse;
  const float g = counted ? grad_scale : 0.0f;
  for (int i = threadIdx.x; i * kVector < padded; i += kRowThreads) {
    uint4 raw = vectors[i];
    __nv_bfloat16* v = reinterpret_cast<__nv_bfloat16*>(&raw);
#pragma unroll
    for (int k = 0; k < kVector; ++k) {
      const int j = i * kVector + k;
      const float d =
          j < vocab ? (__expf(__bfloat162float(v[k]) - lse) - (j == y ? 1.0f : 0.0f)) * g : 0.0f;
      v[k] = __float2bfloat16(d);
    }
    vectors[i] = raw;
  }
}

bool CublasOk(cublasStatus_t st, const char* what, std::string* why) {
  if (st == CUBLAS_STATUS_SUCCESS) return true;
  *why = std::string(what) + ": cuBLAS status " + std::to_string(static_cast<int>(st));
  return false;
}

bool CudaOk(cudaError_t st, const char* what, std::string* why) {
  if (st == cudaSuccess) return true;
  *why = std::string(what) + ": " + cudaGetErrorString(st);
  return false;
}

uint16_t Bf16Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even (finite inputs)
  return static_cast<uint16_t>(u >> 16);
}

double Bf16Value(uint16_t bits) {
  const uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

double RelativeNormError(const std::vector<double>& got, const std::vector<double>& want) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

}  // namespace

bool RunQuackRebuild(cublasHandle_t cublas, const QuackRebuildArgs& a, cudaStream_t stream,
                     std::string* why) {
  if (a.padded_vocab % kVector != 0 || a.vocab > a.padded_vocab || a.chunk <= 0) {
    *why = "quack rebuild: padded vocabulary not a multiple of 8, or no chunk";
    return false;
  }
  const float one = 1.0f, zero = 0.0f;
  const int vp = static_cast<int>(a.padded_vocab);
  const int h = static_cast<int>(a.hidden);
  for (int64_t c0 = 0; c0 < a.rows; c0 += a.chunk) {
    const int rows = static_cast<int>(std::min(a.chunk, a.rows - c0));
    const char* x = static_cast<const char*>(a.x) + c0 * a.hidden * 2;
    char* gi = static_cast<char*>(a.grad_input) + c0 * a.hidden * 2;
    if (!CublasOk(cublasGemmEx(cublas, CUBLAS_OP_T, CUBLAS_OP_N, vp, rows, h, &one, a.w,
                               CUDA_R_16BF, h, x, CUDA_R_16BF, h, &zero, a.logits, CUDA_R_16BF, vp,
                               CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                  "logits GEMM", why)) {
      return false;
    }
    LossAndDlogitsInPlace<<<rows, kRowThreads, 0, stream>>>(
        static_cast<__nv_bfloat16*>(a.logits), a.padded_vocab, static_cast<int32_t>(a.vocab), vp,
        a.target + c0, a.loss + c0, a.grad_scale);
    if (!CudaOk(cudaGetLastError(), "row kernel", why)) return false;
    if (!CublasOk(cublasGemmEx(cublas, CUBLAS_OP_N, CUBLAS_OP_N, h, rows, vp, &one, a.w,
                               CUDA_R_16BF, h, a.logits, CUDA_R_16BF, vp, &zero, gi, CUDA_R_16BF, h,
                               CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                  "grad_input GEMM", why) ||
        !CublasOk(cublasGemmEx(cublas, CUBLAS_OP_N, CUBLAS_OP_T, h, vp, rows, &one, x, CUDA_R_16BF,
                               h, a.logits, CUDA_R_16BF, vp, c0 == 0 ? &zero : &one, a.grad_weight,
                               CUDA_R_32F, h, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                  "grad_W GEMM", why)) {
      return false;
    }
  }
  return true;
}

nlohmann::json ValidateQuackRebuild(cublasHandle_t cublas, cudaStream_t stream) {
  constexpr int64_t bt = 4096 + 64, h = 64, v = 5003, vp = 5008;
  nlohmann::json out = {{"product", "cublas_quack_rebuild"},
                        {"check", "float64 reference, fresh random data, NaN-poisoned outputs"},
                        {"BT", bt},
                        {"H", h},
                        {"V", v}};
  std::mt19937_64 rng(std::random_device{}());
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int32_t> token(0, v - 1);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  std::vector<uint16_t> x(bt * h), w(vp * h, 0);
  std::vector<int32_t> target(bt);
  for (auto& e : x) e = Bf16Bits(normal(rng));
  for (int64_t i = 0; i < v * h; ++i) w[i] = Bf16Bits(normal(rng) / std::sqrt(float(h)));
  int64_t valid = 0;
  for (auto& t : target) {
    t = unit(rng) < 0.05f ? -1 : token(rng);
    valid += t >= 0;
  }
  std::string why;
  void *dx = nullptr, *dw = nullptr, *dlogits = nullptr, *dgi = nullptr;
  float *dloss = nullptr, *dgw = nullptr;
  int32_t* dtarget = nullptr;
  const auto fail = [&](const std::string& what) {
    out["ok"] = false;
    out["error"] = what;
    return out;
  };
  if (!CudaOk(cudaMalloc(&dx, bt * h * 2), "malloc", &why) ||
      !CudaOk(cudaMalloc(&dw, vp * h * 2), "malloc", &why) ||
      !CudaOk(cudaMalloc(&dlogits, 4096 * vp * 2), "malloc", &why) ||
      !CudaOk(cudaMalloc(&dgi, bt * h * 2), "malloc", &why) ||
      !CudaOk(cudaMalloc(reinterpret_cast<void**>(&dloss), bt * 4), "malloc", &why) ||
      !CudaOk(cudaMalloc(reinterpret_cast<void**>(&dgw), vp * h * 4), "malloc", &why) ||
      !CudaOk(cudaMalloc(reinterpret_cast<void**>(&dtarget), bt * 4), "malloc", &why) ||
      !CudaOk(cudaMemcpy(dx, x.data(), bt * h * 2, cudaMemcpyHostToDevice), "upload", &why) ||
      !CudaOk(cudaMemcpy(dw, w.data(), vp * h * 2, cudaMemcpyHostToDevice), "upload", &why) ||
      !CudaOk(cudaMemcpy(dtarget, target.data(), bt * 4, cudaMemcpyHostToDevice), "upload", &why) ||
      // 0xff bytes: NaN in bf16 and fp32 alike, so an unwritten element shows.
      !CudaOk(cudaMemset(dgi, 0xff, bt * h * 2), "poison", &why) ||
      !CudaOk(cudaMemset(dloss, 0xff, bt * 4), "poison", &why) ||
      !CudaOk(cudaMemset(dgw, 0xff, vp * h * 4), "poison", &why)) {
    return fail(why);
  }
  QuackRebuildArgs a;
  a.rows = bt;
  a.hidden = h;
  a.vocab = v;
  a.padded_vocab = vp;
  a.x = dx;
  a.w = dw;
  a.target = dtarget;
  a.grad_scale = 1.0f / static_cast<float>(valid);
  a.logits = dlogits;
  a.loss = dloss;
  a.grad_input = dgi;
  a.grad_weight = dgw;
  std::vector<float> loss(bt), gw(vp * h);
  std::vector<uint16_t> gi(bt * h);
  if (!RunQuackRebuild(cublas, a, stream, &why)) return fail(why);
  if (!CudaOk(cudaStreamSynchronize(stream), "run", &why) ||
      !CudaOk(cudaMemcpy(loss.data(), dloss, bt * 4, cudaMemcpyDeviceToHost), "download", &why) ||
      !CudaOk(cudaMemcpy(gi.data(), dgi, bt * h * 2, cudaMemcpyDeviceToHost), "download", &why) ||
      !CudaOk(cudaMemcpy(gw.data(), dgw, vp * h * 4, cudaMemcpyDeviceToHost), "download", &why)) {
    return fail(why);
  }
  for (void* p : {dx, dw, dlogits, dgi, static_cast<void*>(dloss), static_cast<void*>(dgw),
                  static_cast<void*>(dtarget)}) {
    cudaFree(p);
  }

  // The reference: float64 over the same bf16 values.
  std::vector<double> wd(vp * h), ref_gi(bt * h, 0.0), ref_gw(vp * h, 0.0), got_gi(bt * h),
      got_gw(vp * h);
  for (int64_t i = 0; i < vp * h; ++i) wd[i] = Bf16Value(w[i]);
  double ref_loss = 0.0, ref_loss_abs = 0.0, got_loss = 0.0;
  int64_t unwritten = 0;
  std::vector<double> z(v), xt(h);
  for (int64_t t = 0; t < bt; ++t) {
    for (int64_t k = 0; k < h; ++k) xt[k] = Bf16Value(x[t * h + k]);
    double m = -std::numeric_limits<double>::infinity();
    for (int64_t j = 0; j < v; ++j) {
      double s = 0.0;
      for (int64_t k = 0; k < h; ++k) s += xt[k] * wd[j * h + k];
      z[j] = s;
      m = std::max(m, s);
    }
    double sum = 0.0;
    for (int64_t j = 0; j < v; ++j) sum += std::exp(z[j] - m);
    const double lse = m + std::log(sum);
    const int32_t y = target[t];
    if (std::isnan(loss[t])) ++unwritten;
    got_loss += loss[t];
    if (y < 0) continue;
    ref_loss += lse - z[y];
    ref_loss_abs += std::abs(lse - z[y]);
    const double g = 1.0 / static_cast<double>(valid);
    for (int64_t j = 0; j < v; ++j) {
      const double d = (std::exp(z[j] - lse) - (j == y ? 1.0 : 0.0)) * g;
      for (int64_t k = 0; k < h; ++k) {
        ref_gi[t * h + k] += d * wd[j * h + k];
        ref_gw[j * h + k] += d * xt[k];
      }
    }
  }
  for (int64_t i = 0; i < bt * h; ++i) {
    got_gi[i] = Bf16Value(gi[i]);
    unwritten += std::isnan(got_gi[i]);
  }
  for (int64_t i = 0; i < vp * h; ++i) {
    got_gw[i] = gw[i];
    unwritten += std::isnan(got_gw[i]);
  }
  const double loss_error = std::abs(got_loss - ref_loss) / ref_loss_abs;
  const double gi_error = RelativeNormError(got_gi, ref_gi);
  const double gw_error = RelativeNormError(got_gw, ref_gw);
  out["unwritten_elements"] = unwritten;
  out["loss_sum_rel_error"] = loss_error;
  out["grad_input_rel_error"] = gi_error;
  out["grad_weight_rel_error"] = gw_error;
  // bf16 logits round z by up to 2^-9 |z|, bf16 dlogits by 2^-9: a wrong
  // layout, chunk or scale is off by O(1).
  out["tolerance"] = {{"loss_sum", 1e-3}, {"grad_input", 1e-2}, {"grad_weight", 1e-2}};
  out["ok"] = unwritten == 0 && loss_error <= 1e-3 && gi_error <= 1e-2 && gw_error <= 1e-2;
  return out;
}

}  // namespace flce::bench
