// Device-side building blocks of the Hopper (sm_90a) GEMM kernels: mbarriers,
// TMA loads, stores and reduce-adds, shared-memory matrix descriptors and
// wgmma. Compiled only into the sm_90a object library (kernels/cuda/
// CMakeLists.txt); FLCE_SM90A is set where the target has these instructions.
#ifndef FLCE_KERNELS_CUDA_OPS_SM90_SM90_PRIMITIVES_CUH_
#define FLCE_KERNELS_CUDA_OPS_SM90_SM90_PRIMITIVES_CUH_

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <mutex>

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FLCE_SM90A 1
#endif

namespace flce::cuda::sm90 {

__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// The kernels' shared-memory struct at the first 1024-byte boundary of the
// dynamic shared memory (the 128-byte swizzle's atoms are 1024 bytes).
template <typename T>
__device__ __forceinline__ T& AlignedShared(uint8_t* raw) {
  return *reinterpret_cast<T*>((reinterpret_cast<uintptr_t>(raw) + 1023) &
                               ~static_cast<uintptr_t>(1023));
}

// Where a pipeline is in its ring of stages: the stage and the parity of
// the ring's current pass.
template <int kStages>
struct StageCursor {
  int stage = 0;
  uint32_t phase = 0;
  __device__ __forceinline__ void Next() {
    if (++stage == kStages) {
      stage = 0;
      phase ^= 1;
    }
  }
  // Past `blocks` stages at once: in a ping-pong kernel, the other consumer
  // warpgroup's tile.
  __device__ __forceinline__ void Skip(int32_t blocks) {
    const int32_t next = stage + blocks;
    phase ^= static_cast<uint32_t>(next / kStages) & 1u;
    stage = next % kStages;
  }
};

// Lets `kKernel` have `bytes` of dynamic shared memory on the current device.
// A function's attributes belong to the device's context, so a process that
// drives several GPUs (a head split across them) sets it once per device; the
// result is returned to every later launch there.
template <auto kKernel>
cudaError_t AllowDynamicShared(size_t bytes) {
  int device = 0;
  const cudaError_t current = cudaGetDevice(&device);
  if (current != cudaSuccess) return current;
  static std::mutex mu;
  static std::map<int, cudaError_t> done;
  std::lock_guard<std::mutex> lock(mu);
  auto it = done.find(device);
  if (it != done.end()) return it->second;
  const cudaError_t result = cudaFuncSetAttribute(
      kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
  done.emplace(device, result);
  return result;
}

#ifdef FLCE_SM90A
__device__ __forceinline__ void MbarInit(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(SmemAddr(bar)), "r"(count));
}

// Makes the barriers' initialisation visible to the copy engine.
__device__ __forceinline__ void FenceBarrierInit() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// A producer/consumers ring: `full` completes when a stage's TMA bytes have
// landed (one arrival, the producer's), `empty` when every consumer has
// released it. Thread 0 initialises; the block synchronises after.
template <int kStages>
__device__ __forceinline__ void InitStageBarriers(uint64_t (&full)[kStages],
                                                  uint64_t (&empty)[kStages], uint32_t consumers) {
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      MbarInit(&full[s], 1);
      MbarInit(&empty[s], consumers);
    }
    FenceBarrierInit();
  }
  __syncthreads();
}

// This CTA's rank in its thread-block cluster.
__device__ __forceinline__ uint32_t ClusterCtaRank() {
  uint32_t rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
  return rank;
}

// Every thread of every CTA of the cluster; the barriers' initialisation
// (FenceBarrierInit) is visible to the peers after it.
__device__ __forceinline__ void ClusterSync() {
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
}

// Arrives on the barrier at `bar`'s offset in the shared memory of the
// cluster's CTA `cta` (CTA-scope semantics, as CUTLASS's remote arrive: with
// a cluster-scope release per stage CTA pairs run far slower,
// docs/perf/cuda.md).
__device__ __forceinline__ void MbarArriveInCta(uint64_t* bar, uint32_t cta) {
  asm volatile(
      "{\n"
      ".reg .b32 remote;\n"
      "mapa.shared::cluster.u32 remote, %0, %1;\n"
      "mbarrier.arrive.shared::cluster.b64 _, [remote];\n"
      "}\n" ::"r"(SmemAddr(bar)),
      "r"(cta)
      : "memory");
}

__device__ __forceinline__ void MbarExpectTx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(SmemAddr(bar)),
               "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void MbarArrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(SmemAddr(bar)) : "memory");
}

// Returns once the phase of parity `parity` has completed.
__device__ __forceinline__ void MbarWait(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n"
        "}\n"
        : "=r"(done)
        : "r"(SmemAddr(bar)), "r"(parity)
        : "memory");
  } while (!done);
}

__device__ __forceinline__ void TmaLoad(void* dst, const CUtensorMap* map, uint64_t* bar, int c0,
                                        int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4}], [%2];" ::"r"(SmemAddr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(SmemAddr(bar)), "r"(c0), "r"(c1)
      : "memory");
}

// One box into `dst`'s offset in the shared memory of every CTA of the
// cluster named in `cta_mask`, each CTA's barrier at `bar`'s offset counting
// the bytes that land there.
__device__ __forceinline__ void TmaLoadMulticast(void* dst, const CUtensorMap* map, uint64_t* bar,
                                                 int c0, int c1, uint16_t cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      ".multicast::cluster [%0], [%1, {%4, %5}], [%2], %3;" ::"r"(SmemAddr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(SmemAddr(bar)), "h"(cta_mask), "r"(c0), "r"(c1)
      : "memory");
}

// Box stores from shared memory; rows and columns outside the tensor are
// dropped by the copy engine.
__device__ __forceinline__ void TmaStore(const CUtensorMap* map, const void* src, int c0, int c1) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(SmemAddr(src)), "r"(c0), "r"(c1)
               : "memory");
}
__device__ __forceinline__ void TmaStore3d(const CUtensorMap* map, const void* src, int c0, int c1,
                                           int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%2, %3, %4}], [%1];" ::"l"(
          reinterpret_cast<uint64_t>(map)),
      "r"(SmemAddr(src)), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}
// global += box, element by element (fp32 adds done by the copy engine).
__device__ __forceinline__ void TmaReduceAdd(const CUtensorMap* map, const void* src, int c0,
                                             int c1) {
  asm volatile(
      "cp.reduce.async.bulk.tensor.2d.global.shared::cta.add.bulk_group [%0, {%2, %3}], [%1];" ::
          "l"(reinterpret_cast<uint64_t>(map)),
      "r"(SmemAddr(src)), "r"(c0), "r"(c1)
      : "memory");
}
// Starts pulling a box of the tensor into L2 (no completion to wait for).
__device__ __forceinline__ void TmaPrefetchL2(const CUtensorMap* map, int c0, int c1) {
  asm volatile("cp.async.bulk.prefetch.tensor.2d.L2.global [%0, {%1, %2}];" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(c0), "r"(c1)
               : "memory");
}
__device__ __forceinline__ void TmaStoreCommit() {
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}
// Until the stores issued so far have read their shared memory.
__device__ __forceinline__ void TmaStoreWaitRead() {
  asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
}
// Until the stores issued so far are complete.
__device__ __forceinline__ void TmaStoreWaitAll() {
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}
__device__ __forceinline__ void StoreShared(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.u32 [%0], %1;" ::"r"(addr), "r"(v) : "memory");
}
__device__ __forceinline__ void StoreShared(uint32_t addr, float a, float b) {
  asm volatile("st.shared.v2.f32 [%0], {%1, %2};" ::"r"(addr), "f"(a), "f"(b) : "memory");
}
// Programmatic dependent launch: once every CTA of this grid has said so,
// a kernel launched after it with programmatic stream serialization may
// start its CTAs on SMs this grid leaves (no-op without such a dependent).
__device__ __forceinline__ void LetDependentGridStart() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}
// In such a dependent: until the grids it depends on have completed and
// their writes are visible (returns at once in a kernel launched normally).
__device__ __forceinline__ void WaitForPrerequisiteGrids() {
  asm volatile("griddepcontrol.wait;" ::: "memory");
}
// Makes this thread's shared-memory writes visible to the copy engine.
__device__ __forceinline__ void FenceSharedForAsync() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
// Columns 32 j .. 32 j + 31 of a warpgroup's m64 x n128 fp32 fragment into a
// staging box of 64 rows x 32 columns (128-byte rows, 128-byte swizzle) at
// shared address `box`. Fragment layout (m64nNk16): frag[i*4 + 2*r + b] is
// column 8i + 2(lane%4) + b of row 16*warp + lane/4 + 8r; in the box that
// pair lands in 16-byte chunk (2 (i%4) + (lane%4)/2) ^ (row%8).
__device__ __forceinline__ void StageFragmentQuarter(const float (&frag)[64], int j, uint32_t box) {
  const int t = threadIdx.x % 128;
  const int lane = t % 32;
  const int q = lane % 4;
  const int local_row = (t / 32) * 16 + lane / 4;
#pragma unroll
  for (int ii = 0; ii < 4; ++ii) {
    const int i = j * 4 + ii;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const uint32_t byte =
          (local_row + 8 * r) * 128 + (((2 * ii + q / 2) ^ (lane / 4)) * 16) + (q % 2) * 8;
      StoreShared(box + byte, frag[i * 4 + 2 * r], frag[i * 4 + 2 * r + 1]);
    }
  }
}

// Barrier of one consumer warpgroup (ids 1 and 2; 0 is __syncthreads).
__device__ __forceinline__ void WarpgroupSync(int consumer) {
  asm volatile("bar.sync %0, 128;" ::"r"(consumer + 1) : "memory");
}

// A consumer warpgroup's m64 x n128 fp32 fragments out through its kSlots
// staging boxes of 64 x 32 in rounds: box b holds columns 32 (b % 4) of
// fragment b / 4, and `flush(slot, b)` (called on thread 0) issues its TMA
// store or reduce-add. A round first waits until the previous round's
// stores have read the slots.
template <int kFragments, int kSlots, typename Flush>
__device__ __forceinline__ void StoreFragments(const float (&acc)[kFragments][64], int consumer,
                                               float (&slots)[kSlots][64 * 32], Flush&& flush) {
  constexpr int kBoxes = kFragments * 4;
  static_assert(kBoxes % kSlots == 0, "whole rounds of staging slots");
  const int t = threadIdx.x % 128;
#pragma unroll
  for (int round = 0; round < kBoxes / kSlots; ++round) {
    if (t == 0) TmaStoreWaitRead();
    WarpgroupSync(consumer);
#pragma unroll
    for (int x = 0; x < kSlots; ++x) {
      const int box = round * kSlots + x;
      StageFragmentQuarter(acc[box / 4], box % 4, SmemAddr(slots[x]));
    }
    FenceSharedForAsync();
    WarpgroupSync(consumer);
    if (t == 0) {
#pragma unroll
      for (int x = 0; x < kSlots; ++x) flush(slots[x], round * kSlots + x);
      TmaStoreCommit();
    }
  }
}

// Operand descriptors for the 128-byte swizzle as TMA writes it (boxes of
// 64 16-bit elements per 128-byte row, 1024-byte aligned): the stride offset
// is 1024 bytes (8 rows of 128 bytes) in both majors.
__device__ __forceinline__ uint64_t SmemDesc128B(const void* p, uint32_t leading_bytes) {
  const uint64_t addr = SmemAddr(p);
  uint64_t desc = (addr & 0x3FFFF) >> 4;
  desc |= uint64_t(leading_bytes >> 4) << 16;
  desc |= uint64_t(1024 >> 4) << 32;
  desc |= uint64_t(1) << 62;
  return desc;
}
// K-major: 8-row core matrices 1024 bytes apart (the leading offset is unused
// by the swizzled layout; 16 as CUTLASS sets it).
__device__ __forceinline__ uint64_t SmemDescK(const void* p) { return SmemDesc128B(p, 16); }
// MN-major (each 128-byte row holds 64 M or N elements of one k): groups of
// 8 k 1024 bytes apart, 64-element M/N groups `mn_group_bytes` apart (the
// leading offset; one TMA box of 64 k rows each).
__device__ __forceinline__ uint64_t SmemDescMN(const void* p, uint32_t mn_group_bytes) {
  return SmemDesc128B(p, mn_group_bytes);
}

// A descriptor moved `bytes` further into its tile: only the address field
// (bits 0-13, 16-byte units) changes, and shared memory ends far below that
// field's 256 KiB, so the add never carries out of it. Building one
// descriptor per stage and advancing it per k-step keeps the mainloop to a
// few integer instructions per wgmma instead of a pointer conversion, masks
// and shifts for every operand of every wgmma.
__device__ __forceinline__ uint64_t DescAdvance(uint64_t desc, uint32_t bytes) {
  return desc + (bytes >> 4);
}

__device__ __forceinline__ void WgmmaFence() {
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}
__device__ __forceinline__ void WgmmaCommit() {
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
__device__ __forceinline__ void WgmmaWaitAll() {
  asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
}
__device__ __forceinline__ void WgmmaWaitOne() {
  asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");
}
__device__ __forceinline__ void KeepInRegisters(float& v) { asm volatile("" : "+f"(v)::"memory"); }

// d[64] (m64 x n128 fp32 fragment) += A(64 x 16) . B(16 x 128), fp16 or
// bf16 operands; kMnA / kMnB: the operand is MN-major in shared memory.
template <bool kHalf, bool kMnA, bool kMnB>
__device__ __forceinline__ void Wgmma(float* d, uint64_t desc_a, uint64_t desc_b) {
#define FLCE_WGMMA_BODY(TYPE)                                                                      \
  asm volatile(                                                                                    \
      "{\n"                                                                                        \
      "wgmma.mma_async.sync.aligned.m64n128k16.f32." TYPE "." TYPE                                 \
      " "                                                                                          \
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "     \
      "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, " \
      "%37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, " \
      "%55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, 1, 1, 1, %66, %67;\n"               \
      "}\n"                                                                                        \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),        \
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),    \
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), \
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), \
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), \
        "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), \
        "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), \
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), \
        "+f"(d[63])                                                                                \
      : "l"(desc_a), "l"(desc_b), "n"(kMnA ? 1 : 0), "n"(kMnB ? 1 : 0))
  if constexpr (kHalf) {
    FLCE_WGMMA_BODY("f16");
  } else {
    FLCE_WGMMA_BODY("bf16");
  }
#undef FLCE_WGMMA_BODY
}

// d[96] (m64 x n192 fp32 fragment) += A(64 x 16) . B(16 x 192), bf16
// operands, both K-major: the ping-pong logits kernel's 192-column tiles.
__device__ __forceinline__ void WgmmaBf16N192(float* d, uint64_t desc_a, uint64_t desc_b) {
  asm volatile(
      "{\n"
      "wgmma.mma_async.sync.aligned.m64n192k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "
      "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, "
      "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, "
      "%56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, "
      "%74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, "
      "%92, %93, %94, %95}, %96, %97, 1, 1, 1, 0, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
        "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
        "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),
        "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]),
        "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]),
        "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]),
        "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]),
        "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95])
      : "l"(desc_a), "l"(desc_b));
}

// One tile's k-blocks on a consumer warpgroup. `issue(stage)` issues the
// wgmmas that read a stage; one k-block's MMAs stay in flight while the
// next block's are issued, and a stage is released (by `releaser`, one
// thread of the warpgroup) once the MMAs that read it have completed.
// `all_issued()` runs once the last block's MMAs are issued, before they
// are waited for (a ping-pong kernel hands the tensor cores over there).
// `release(stage)` tells the stage's producers it is free.
template <int kStages, typename Issue, typename AllIssued, typename Release>
__device__ __forceinline__ void ConsumeStagesReleasing(StageCursor<kStages>& at,
                                                       uint64_t (&full)[kStages], int32_t blocks,
                                                       bool releaser, Issue&& issue,
                                                       AllIssued&& all_issued, Release&& release) {
  int prev = -1;
  for (int32_t kb = 0; kb < blocks; ++kb) {
    MbarWait(&full[at.stage], at.phase);
    WgmmaFence();
    issue(at.stage);
    WgmmaCommit();
    WgmmaWaitOne();
    if (prev >= 0 && releaser) release(prev);
    prev = at.stage;
    at.Next();
  }
  all_issued();
  WgmmaWaitAll();
  if (prev >= 0 && releaser) release(prev);
}

template <int kStages, typename Issue, typename AllIssued>
__device__ __forceinline__ void ConsumeStages(StageCursor<kStages>& at, uint64_t (&full)[kStages],
                                              uint64_t (&empty)[kStages], int32_t blocks,
                                              bool releaser, Issue&& issue,
                                              AllIssued&& all_issued) {
  ConsumeStagesReleasing(at, full, blocks, releaser, issue, all_issued,
                         [&](int stage) { MbarArrive(&empty[stage]); });
}

template <int kStages, typename Issue>
__device__ __forceinline__ void ConsumeStages(StageCursor<kStages>& at, uint64_t (&full)[kStages],
                                              uint64_t (&empty)[kStages], int32_t blocks,
                                              bool releaser, Issue&& issue) {
  ConsumeStages(at, full, empty, blocks, releaser, issue, [] {});
}

// Until every stage's last fill has been released: a CTA whose stages a
// cluster peer fills or releases must not exit before that peer is done
// with them.
template <int kStages>
__device__ __forceinline__ void DrainStages(StageCursor<kStages>& at, uint64_t (&empty)[kStages]) {
  for (int s = 0; s < kStages; ++s) {
    MbarWait(&empty[at.stage], at.phase ^ 1);
    at.Next();
  }
}
#endif  // FLCE_SM90A

}  // namespace flce::cuda::sm90

#endif  // FLCE_KERNELS_CUDA_OPS_SM90_SM90_PRIMITIVES_CUH_
