#include <cooperative_groups.h>
#include <cuda_pipeline.h>

#include "kernels/cuda/base/policy.h"
#include "kernels/cuda/base/row_math.cuh"
#include "kernels/cuda/ops/cluster_row_kernel.cuh"

namespace flce::cuda {
namespace {

namespace cg = cooperative_groups;
using Policy = ClusterRowPolicy;

int64_t SegmentFor(int64_t padded_vocab, int cluster) {
  const int64_t seg = (padded_vocab + cluster - 1) / cluster;
  return (seg + 3) / 4 * 4;
}

template <typename T>
__global__ void __launch_bounds__(Policy::kThreads)
    ClusterRowKernel(FusedRowArgs args, int64_t seg) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
  extern __shared__ float4 smem4[];
  float* z = reinterpret_cast<float*>(smem4);
  __shared__ RowState scratch[Policy::kThreads / 32];
  __shared__ RowState block_state;
  __shared__ RowGrad row_grad;

  cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank());
  const int nblocks = static_cast<int>(cluster.num_blocks());
  const int64_t row = blockIdx.x / nblocks;
  const int64_t c0 = rank * seg;
  int64_t c1 = c0 + seg;
  if (c1 > args.padded_vocab) c1 = args.padded_vocab;
  const int64_t n = c1 > c0 ? c1 - c0 : 0;
  const float* lrow = args.logits + row * args.ld_logits + c0;

  // Stage the segment: 16-byte async copies, all in flight at once.
  for (int64_t i = threadIdx.x * 4; i < n; i += Policy::kThreads * 4) {
    __pipeline_memcpy_async(z + i, lrow + i, 16);
  }
  __pipeline_commit();
  __pipeline_wait_prior(0);
  __syncthreads();

  const LossParams p = args.params;
  const T* bias = static_cast<const T*>(args.bias);
  const int32_t y = args.in.target[row];
  int64_t real_end = p.vocab - c0;  // columns of this segment that are real
  if (real_end > n) real_end = n;
  const RowConsts kc = MakeConsts(p);
  // Pass A over shared memory: transform in place, max / argmax / sum z /
  // z_y per thread. Columns come in increasing order per thread, so a strict
  // '>' keeps the lowest index among ties.
  RowState st = EmptyState();
  // Shared memory is read and written as float4 (16 bytes per thread): the
  // conflict-free pattern; scalar strided reads are 4-way bank conflicted.
  for (int64_t i = threadIdx.x * 4; i < real_end; i += Policy::kThreads * 4) {
    float4 v4 = *reinterpret_cast<const float4*>(z + i);
    float v[4] = {v4.x, v4.y, v4.z, v4.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      if (i + k < real_end) {
        const int64_t j = c0 + i + k;
        float r = v[k];
        if (bias != nullptr) r += ToFloat(bias[j]);
        const float zz = TransformLogit(r, p, kc);
        v[k] = zz;
        st.sum_z += zz;
        if (zz > st.amax_value) {
          st.amax_value = zz;
          st.amax_index = static_cast<int32_t>(j);
        }
        if (j == y) st.zy = zz;
      }
    }
    if (bias != nullptr || !kc.identity) {
      *reinterpret_cast<float4*>(z + i) = make_float4(v[0], v[1], v[2], v[3]);
    }
  }
  // Pass B: sum-exp around the thread's own max: one exp per column, no
  // rescaling.
  st.m = st.amax_value;
  for (int64_t i = threadIdx.x * 4; i < real_end; i += Policy::kThreads * 4) {
    const float4 v4 = *reinterpret_cast<const float4*>(z + i);
    const float v[4] = {v4.x, v4.y, v4.z, v4.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      if (i + k < real_end) {
        const float d = v[k] - st.m;
        const float e = __expf(d);
        st.s += e;
        st.sez += e * d;
      }
    }
  }
  st = BlockReduceState<Policy::kThreads>(st, scratch);
  if (threadIdx.x == 0) block_state = st;
  cluster.sync();  // every block's state (and every load) is done

  if (threadIdx.x == 0) {
    // Fixed rank order: the same merge tree on every run.
    RowState total = *cluster.map_shared_rank(&block_state, 0);
    for (int r = 1; r < nblocks; ++r)
      total = MergeStates(total, *cluster.map_shared_rank(&block_state, r));
    RowOutputs out = args.out;
    if (rank != 0) out = RowOutputs{};  // one writer per row
    row_grad = FinishRow(total, args.in, row, p, out);
  }
  cluster.sync();  // no block leaves while another still reads its state
  if (args.dlogits == nullptr) return;
  const RowGrad g = row_grad;
  T* drow =
      reinterpret_cast<T*>(static_cast<char*>(args.dlogits) + row * args.dlogits_row_bytes) + c0;
  for (int64_t i = threadIdx.x * 4; i < n; i += Policy::kThreads * 4) {
    const float4 v4 = *reinterpret_cast<const float4*>(z + i);
    const float v[4] = {v4.x, v4.y, v4.z, v4.w};
    float d[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int64_t j = c0 + i + k;
      d[k] = j < p.vocab ? ColumnGrad(v[k], static_cast<int32_t>(j), g, p, kc) : 0.0f;
    }
    if constexpr (sizeof(T) == 4) {
      *reinterpret_cast<float4*>(drow + i) = make_float4(d[0], d[1], d[2], d[3]);
    } else {
      T v[4] = {FromFloat<T>(d[0]), FromFloat<T>(d[1]), FromFloat<T>(d[2]), FromFloat<T>(d[3])};
      *reinterpret_cast<uint2*>(drow + i) = *reinterpret_cast<const uint2*>(v);
    }
  }
#else
  __trap();  // clusters are Hopper's: Launch() never launches this before sm_90
#endif
}

bool DeviceHasClusters() {
  int device = 0, major = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return major >= 9;
}

template <typename T>
absl::Status Launch(const FusedRowArgs& args, cudaStream_t stream, DeviceHealth* health) {
  if (!DeviceHasClusters()) {
    return absl::FailedPreconditionError("thread-block clusters need sm_90 or later");
  }
  const int cluster = ClusterSizeFor(args.padded_vocab);
  if (cluster == 0) return absl::FailedPreconditionError("row too long for one cluster");
  const int64_t seg = SegmentFor(args.padded_vocab, cluster);
  const size_t smem = static_cast<size_t>(seg) * sizeof(float);
  static_assert(Policy::kMaxSegmentBytes <= 227 * 1024, "within Hopper's shared memory");
  FLCE_CUDA_RETURN_IF_ERROR(
      cudaFuncSetAttribute(ClusterRowKernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(smem)),
      health);
  if (cluster > 8) {
    FLCE_CUDA_RETURN_IF_ERROR(
        cudaFuncSetAttribute(ClusterRowKernel<T>, cudaFuncAttributeNonPortableClusterSizeAllowed,
                             1),
        health);
  }
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(args.rows * cluster));
  config.blockDim = dim3(Policy::kThreads);
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = cluster;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  config.attrs = attr;
  config.numAttrs = 1;
  int clusters = 0;
  cudaError_t occ = cudaOccupancyMaxActiveClusters(&clusters, ClusterRowKernel<T>, &config);
  if (occ != cudaSuccess || clusters == 0) {
    cudaGetLastError();
    return absl::FailedPreconditionError("device cannot schedule the row cluster");
  }
  FLCE_CUDA_RETURN_IF_ERROR(cudaLaunchKernelEx(&config, ClusterRowKernel<T>, args, seg), health);
  return absl::OkStatus();
}

}  // namespace

int ClusterSizeFor(int64_t padded_vocab) {
  for (int c = 1; c <= Policy::kMaxCluster; ++c) {
    if (SegmentFor(padded_vocab, c) * 4 <= Policy::kMaxSegmentBytes) return c;
  }
  return 0;
}

bool ClusterRowsFit(int64_t padded_vocab) {
  return ClusterSizeFor(padded_vocab) > 0 && DeviceHasClusters();
}

absl::Status LaunchClusterRows(DType dtype, const FusedRowArgs& args, cudaStream_t stream,
                               DeviceHealth* health) {
  if (args.rows <= 0) return absl::OkStatus();
  if (args.probs != nullptr || (args.dlogits != nullptr && args.dlogits != args.logits) ||
      args.ld_logits % 4 != 0 || args.padded_vocab % 4 != 0) {
    return absl::InternalError("cluster row kernel: unsupported layout");
  }
  switch (dtype) {
    case DType::kF32:
      return Launch<float>(args, stream, health);
    case DType::kF16:
      return Launch<__half>(args, stream, health);
    case DType::kBF16:
      return Launch<__nv_bfloat16>(args, stream, health);
  }
  return absl::InvalidArgumentError("unknown dtype");
}

}  // namespace flce::cuda
