// PTX wrappers for the sm_90 (Hopper) path: the tensor memory accelerator (TMA) copies tiles
// from global to shared memory, mbarriers tell consumers when a copy has landed and producers
// when a stage is free again, and wgmma multiplies a 64-row tile of A by an N-column tile of B
// for a whole warpgroup (4 warps), reading both operands from shared memory through descriptors.
// Each wrapper is one instruction. The wgmma and setmaxnreg ones need the sm_90a target.
#pragma once

#include "mma.cuh"

#include <cuda.h>

#include <cstdint>

namespace mm_variants::cuda::hopper {

using mma::smem_addr;

// ---------------------------------------------------------------------------------------------
// mbarrier: a shared-memory barrier that completes a phase when `count` threads have arrived
// and every byte it was told to expect (expect_tx) has been written by the copy engine.

__device__ __forceinline__ void mbarrier_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count)
               : "memory");
}

// Makes initialized barriers visible to the copy engine (the async proxy) before first use.
__device__ __forceinline__ void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// Arrives and announces `bytes` that TMA copies will deliver to this phase.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)),
               "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}

// Waits until the phase of parity `phase` has completed. A fresh barrier is in phase 0, so
// waiting for parity 1 returns at once: producers start with every stage free.
__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, uint32_t phase) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(smem_addr(bar)), "r"(phase)
        : "memory");
  } while (!done);
}

// Programmatic dependent launch (a KernelLaunch starting_early): the block may be running
// before the previous kernel on the stream has finished. This waits until that kernel has
// completed and its memory writes are visible; before it, a block may only set up its shared
// memory.
__device__ __forceinline__ void wait_for_previous_grid() {
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
}

// Lets the next kernel on the stream, if it was launched starting early, begin once every block
// of this one has called this or exited; its blocks then wait for this kernel to complete.
__device__ __forceinline__ void allow_next_grid() {
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}

// ---------------------------------------------------------------------------------------------
// Thread-block clusters: CTAs launched together on neighbouring SMs that can reach each other's
// shared memory.

__device__ __forceinline__ uint32_t cluster_cta_rank() {
  uint32_t rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
  return rank;
}

// The address of `ptr`'s offset in the shared memory of CTA `cta` of the cluster (distributed
// shared memory), for the shared::cluster instructions below.
__device__ __forceinline__ uint32_t cluster_smem_addr(const void* ptr, uint32_t cta) {
  uint32_t remote;
  asm("mapa.shared::cluster.u32 %0, %1, %2;\n"
               : "=r"(remote)
               : "r"(smem_addr(ptr)), "r"(cta));
  return remote;
}

// Arrives on the barrier at `bar`'s offset in the shared memory of CTA `cta` of the cluster. The
// default (CTA-scope) release suffices for a consumer handing back a stage it has finished
// reading; a cluster-scope release here costs a third of the matmul's throughput.
__device__ __forceinline__ void mbarrier_arrive_cluster(uint64_t* bar, uint32_t cta) {
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(cluster_smem_addr(bar, cta))
               : "memory");
}

// Four floats from a cluster_smem_addr address, in this CTA's or another's shared memory.
__device__ __forceinline__ float4 ld_cluster_float4(uint32_t addr) {
  float4 v;
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(addr)
               : "memory");
  return v;
}

// Every thread of every CTA of the cluster: shared-memory writes before it (barrier inits
// included) are visible cluster-wide after it.
__device__ __forceinline__ void cluster_sync() {
  asm volatile(
      "barrier.cluster.arrive.release.aligned;\n"
      "barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

// ---------------------------------------------------------------------------------------------
// TMA: one thread copies a whole box of a 2-D tensor (described by a CUtensorMap built on the
// host) into shared memory; elements outside the tensor arrive as zeros, so edge tiles need no
// predicates. c0 indexes the contiguous dimension. Completion is signalled on `bar`.

// How L2 keeps the lines a copy reads: as it keeps any (the default), or by a policy that
// createpolicy made.
struct L2Policy {
  bool given = false;
  uint64_t policy = 0;
};

// For data read once, such as a decode weight: L2 gives up its lines first, so streaming it
// neither pushes out lines that will be read again nor makes room by writing back dirty ones.
__device__ __forceinline__ L2Policy l2_evict_first() {
  uint64_t policy;
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  return {true, policy};
}

__device__ __forceinline__ void tma_load_2d(void* dst, const CUtensorMap* map, uint64_t* bar,
                                            int c0, int c1, L2Policy l2 = {}) {
  if (l2.given) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
        ".L2::cache_hint [%0], [%1, {%2, %3}], [%4], %5;\n" ::"r"(smem_addr(dst)),
        "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(smem_addr(bar)),
        "l"(l2.policy)
        : "memory");
  } else {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%2, %3}], [%4];\n" ::"r"(smem_addr(dst)),
        "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(smem_addr(bar))
        : "memory");
  }
}

// The same from a 3-D map (tensor_map.cuh's batch_tile_map): c2 picks the batch entry.
__device__ __forceinline__ void tma_load_3d(void* dst, const CUtensorMap* map, uint64_t* bar,
                                            int c0, int c1, int c2, L2Policy l2 = {}) {
  if (l2.given) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
        ".L2::cache_hint [%0], [%1, {%2, %3, %4}], [%5], %6;\n" ::"r"(smem_addr(dst)),
        "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(smem_addr(bar)),
        "l"(l2.policy)
        : "memory");
  } else {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(smem_addr(dst)),
        "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(smem_addr(bar))
        : "memory");
  }
}

// The same box delivered to the same shared-memory offset of every CTA of the cluster in
// `cta_mask`, each signalling its own barrier at `bar`'s offset: one read of L2 feeds them all.
__device__ __forceinline__ void tma_load_2d_multicast(void* dst, const CUtensorMap* map,
                                                      uint64_t* bar, int c0, int c1,
                                                      uint16_t cta_mask, L2Policy l2 = {}) {
  if (l2.given) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
        ".multicast::cluster.L2::cache_hint [%0], [%1, {%2, %3}], [%4], %5, %6;\n" ::"r"(
            smem_addr(dst)),
        "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(smem_addr(bar)),
        "h"(cta_mask), "l"(l2.policy)
        : "memory");
  } else {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
        ".multicast::cluster [%0], [%1, {%2, %3}], [%4], %5;\n" ::"r"(smem_addr(dst)),
        "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(smem_addr(bar)),
        "h"(cta_mask)
        : "memory");
  }
}

// The reverse copy, shared -> global, tracked as a bulk group of the issuing thread. Elements of
// the box outside the tensor are not written.
__device__ __forceinline__ void tma_store_2d(const CUtensorMap* map, const void* src, int c0,
                                             int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];\n" ::"l"(
          reinterpret_cast<uint64_t>(map)),
      "r"(c0), "r"(c1), "r"(smem_addr(src))
      : "memory");
}

__device__ __forceinline__ void tma_store_commit() {
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}

// Waits until all but the kPending most recent of the issuing thread's store groups have
// finished reading shared memory, so that their buffers may be refilled.
template <int kPending>
__device__ __forceinline__ void tma_store_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(kPending) : "memory");
}

// Makes this thread's ordinary shared-memory writes visible to the copy engine.
__device__ __forceinline__ void fence_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// A barrier for `threads` threads (a multiple of 32) on hardware barrier `id` (1-15; 0 is
// __syncthreads), e.g. one warpgroup.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

__device__ __forceinline__ void prefetch_tensor_map(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// ---------------------------------------------------------------------------------------------
// Register reallocation between warpgroups (sm_90a): the producer gives registers back, the
// consumers that hold the accumulators take them.

template <int kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

template <int kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

// ---------------------------------------------------------------------------------------------
// wgmma (sm_90a).
//
// A shared-memory operand is given by a 64-bit descriptor: start address, the byte offsets
// between 8 x 16-byte "core matrices" along its two dimensions, and the swizzle the tile was
// written with. Tiles here are written by TMA with 128-byte swizzling, in rows of 128 bytes
// (64 16-bit elements) and atoms of 8 rows (1024 bytes):
// - K-major (K contiguous): rows run along M/N; the stride between 8-row groups is 1024 bytes,
//   the leading offset is unused. A k16 step moves the start 32 bytes along the row.
// - MN-major (M or N contiguous): rows run along K; 8-row groups of K are 1024 bytes apart
//   (stride offset) and 64-element blocks of M/N are `mn_block_bytes` apart (leading offset).
//   A k16 step moves the start 16 rows, 2048 bytes.
__device__ __forceinline__ uint64_t smem_descriptor(const void* tile, uint32_t leading_bytes,
                                                    uint32_t stride_bytes) {
  constexpr uint64_t kSwizzle128B = 1;
  return static_cast<uint64_t>((smem_addr(tile) & 0x3FFFF) >> 4) |
         static_cast<uint64_t>((leading_bytes & 0x3FFFF) >> 4) << 16 |
         static_cast<uint64_t>((stride_bytes & 0x3FFFF) >> 4) << 32 | kSwizzle128B << 62;
}

// Orders register accesses before the wgmmas that read or write them.
__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}

__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

// Waits until at most kPending committed wgmma groups of this warp are still running.
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

// Keeps the compiler from moving accumulator reads or writes across an asynchronous wgmma.
template <int N>
__device__ __forceinline__ void fence_registers(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// The accumulator operands of m64nNk16: thread (warp w, lane 4g + t) holds, for each 8-column
// block j, C[16w + g][8j + 2t, +1] in d[4j], d[4j + 1] and C[16w + g + 8][8j + 2t, +1] in
// d[4j + 2], d[4j + 3]: N / 2 floats.
#define MMV_ACC4(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3])
#define MMV_ACC8(i) MMV_ACC4(i), MMV_ACC4(i + 4)
#define MMV_ACC16(i) MMV_ACC8(i), MMV_ACC8(i + 8)
#define MMV_ACC32(i) MMV_ACC16(i), MMV_ACC16(i + 16)
#define MMV_ACC64(i) MMV_ACC32(i), MMV_ACC32(i + 32)
#define MMV_ACC40(i) MMV_ACC32(i), MMV_ACC8(i + 32)
#define MMV_ACC48(i) MMV_ACC32(i), MMV_ACC16(i + 32)
#define MMV_ACC80(i) MMV_ACC64(i), MMV_ACC16(i + 64)
#define MMV_ACC96(i) MMV_ACC64(i), MMV_ACC32(i + 64)
#define MMV_ACC128(i) MMV_ACC64(i), MMV_ACC64(i + 64)
#define MMV_REGS4 "%0, %1, %2, %3"
#define MMV_REGS8 MMV_REGS4 ", %4, %5, %6, %7"
#define MMV_REGS16 MMV_REGS8 ", %8, %9, %10, %11, %12, %13, %14, %15"
#define MMV_REGS32 \
  MMV_REGS16 ", %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define MMV_REGS40 MMV_REGS32 ", %32, %33, %34, %35, %36, %37, %38, %39"
#define MMV_REGS48 MMV_REGS40 ", %40, %41, %42, %43, %44, %45, %46, %47"
#define MMV_REGS64 \
  MMV_REGS32 ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47" \
             ", %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define MMV_REGS80 \
  MMV_REGS64 ", %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79"
#define MMV_REGS96 \
  MMV_REGS80 ", %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95"
#define MMV_REGS128 \
  MMV_REGS64 ", %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79" \
             ", %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95" \
             ", %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109" \
             ", %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122" \
             ", %123, %124, %125, %126, %127"
// D[64 x N] (+)= A[64 x 16] B[16 x N]; the operands after the N / 2 accumulators are A's and B's
// descriptors, the accumulate flag and the two transpose immediates, numbered from N / 2.
#define MMV_WGMMA(N, TYPE, REGS, A, B, SCALE, TA, TB)                                 \
  "{\n.reg .pred p;\nsetp.ne.b32 p, %" #SCALE ", 0;\n"                                \
  "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TYPE "." TYPE "\n{" REGS "},\n" \
  "%" #A ", %" #B ", p, 1, 1, %" #TA ", %" #TB ";\n}\n"
// The instruction for N, in bf16 or f16. ACC is only ever expanded here, never passed on.
#define MMV_WGMMA_N(N, REGS, ACC, A, B, SCALE, TA, TB)                                     \
  if constexpr (kBf16) {                                                                  \
    asm volatile(MMV_WGMMA(N, "bf16", REGS, A, B, SCALE, TA, TB)                          \
                 : ACC                                                                    \
                 : "l"(a_desc), "l"(b_desc), "r"(scale_d), "n"(kTa), "n"(kTb));           \
  } else {                                                                                \
    asm volatile(MMV_WGMMA(N, "f16", REGS, A, B, SCALE, TA, TB)                           \
                 : ACC                                                                    \
                 : "l"(a_desc), "l"(b_desc), "r"(scale_d), "n"(kTa), "n"(kTb));           \
  }

// D[64 x N] (+)= A[64 x 16] B[16 x N] for one warpgroup, float accumulation. The block tiles use
// N = 64, 128, 192 or 256 (320 as 256 + 64), and 80, 96, 160 or 192 tokens when the output is
// computed transposed; the skinny rung puts up to 64 tokens in N. `accumulate` false overwrites D
// (the first step of a tile). kTransA / kTransB: A is M-major / B is N-major.
template <int N, bool kBf16, bool kTransA, bool kTransB>
__device__ __forceinline__ void wgmma_m64k16(float (&d)[N / 2], uint64_t a_desc, uint64_t b_desc,
                                             bool accumulate) {
  const int scale_d = accumulate;
  constexpr int kTa = kTransA, kTb = kTransB;
  if constexpr (N == 8) {
    MMV_WGMMA_N(8, MMV_REGS4, MMV_ACC4(0), 4, 5, 6, 7, 8)
  } else if constexpr (N == 16) {
    MMV_WGMMA_N(16, MMV_REGS8, MMV_ACC8(0), 8, 9, 10, 11, 12)
  } else if constexpr (N == 32) {
    MMV_WGMMA_N(32, MMV_REGS16, MMV_ACC16(0), 16, 17, 18, 19, 20)
  } else if constexpr (N == 64) {
    MMV_WGMMA_N(64, MMV_REGS32, MMV_ACC32(0), 32, 33, 34, 35, 36)
  } else if constexpr (N == 80) {
    MMV_WGMMA_N(80, MMV_REGS40, MMV_ACC40(0), 40, 41, 42, 43, 44)
  } else if constexpr (N == 96) {
    MMV_WGMMA_N(96, MMV_REGS48, MMV_ACC48(0), 48, 49, 50, 51, 52)
  } else if constexpr (N == 128) {
    MMV_WGMMA_N(128, MMV_REGS64, MMV_ACC64(0), 64, 65, 66, 67, 68)
  } else if constexpr (N == 160) {
    MMV_WGMMA_N(160, MMV_REGS80, MMV_ACC80(0), 80, 81, 82, 83, 84)
  } else if constexpr (N == 192) {
    MMV_WGMMA_N(192, MMV_REGS96, MMV_ACC96(0), 96, 97, 98, 99, 100)
  } else {
    static_assert(N == 256, "N is 8, 16, 32, 64, 80, 96, 128, 160, 192 or 256 here");
    MMV_WGMMA_N(256, MMV_REGS128, MMV_ACC128(0), 128, 129, 130, 131, 132)
  }
}

// D[64 x N] (+)= A[64 x 8] B[8 x N] in tf32, float accumulation, A from registers: thread
// (warp w, lane 4g + t) gives A[16w + g][t], A[16w + g + 8][t], A[16w + g][t + 4] and
// A[16w + g + 8][t + 4], as an mma.m16n8k8 A fragment. B is K-major (tf32 has no transposes); the
// tensor core reads the top 19 bits of each 32-bit element. N is 8, 16, 32 or 64 (the skinny
// rung's tokens), or 128, 192 or 256 (rung 9's tiles).
#define MMV_WGMMA_TF32(N, REGS, A0, A1, A2, A3, B, SCALE)                          \
  "{\n.reg .pred p;\nsetp.ne.b32 p, %" #SCALE ", 0;\n"                            \
  "wgmma.mma_async.sync.aligned.m64n" #N "k8.f32.tf32.tf32\n{" REGS "},\n"       \
  "{%" #A0 ", %" #A1 ", %" #A2 ", %" #A3 "}, %" #B ", p, 1, 1;\n}\n"
#define MMV_WGMMA_TF32_N(N, REGS, ACC, A0, A1, A2, A3, B, SCALE)                        \
  asm volatile(MMV_WGMMA_TF32(N, REGS, A0, A1, A2, A3, B, SCALE)                        \
               : ACC                                                                  \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(scale_d));

template <int N>
__device__ __forceinline__ void wgmma_m64k8_tf32(float (&d)[N / 2], const uint32_t (&a)[4],
                                                 uint64_t b_desc, bool accumulate) {
  const int scale_d = accumulate;
  if constexpr (N == 8) {
    MMV_WGMMA_TF32_N(8, MMV_REGS4, MMV_ACC4(0), 4, 5, 6, 7, 8, 9)
  } else if constexpr (N == 16) {
    MMV_WGMMA_TF32_N(16, MMV_REGS8, MMV_ACC8(0), 8, 9, 10, 11, 12, 13)
  } else if constexpr (N == 32) {
    MMV_WGMMA_TF32_N(32, MMV_REGS16, MMV_ACC16(0), 16, 17, 18, 19, 20, 21)
  } else if constexpr (N == 64) {
    MMV_WGMMA_TF32_N(64, MMV_REGS32, MMV_ACC32(0), 32, 33, 34, 35, 36, 37)
  } else if constexpr (N == 128) {
    MMV_WGMMA_TF32_N(128, MMV_REGS64, MMV_ACC64(0), 64, 65, 66, 67, 68, 69)
  } else if constexpr (N == 192) {
    MMV_WGMMA_TF32_N(192, MMV_REGS96, MMV_ACC96(0), 96, 97, 98, 99, 100, 101)
  } else {
    static_assert(N == 256, "N is 8, 16, 32, 64, 128, 192 or 256 here");
    MMV_WGMMA_TF32_N(256, MMV_REGS128, MMV_ACC128(0), 128, 129, 130, 131, 132, 133)
  }
}

// The A fragment of wgmma_m64k8_tf32's k8 step `step` as raw float bits (the caller rounds or
// splits them), loaded from a warpgroup's 64 rows of an M-major float tile: two boxes of 32 rows,
// kBoxBytes apart, each a run of K lines of 128 bytes with the 128-byte swizzle (16-byte chunk c
// of line k at c ^ k % 8). Thread (warp w, lane 4g + t) takes rows 16w + g and 16w + g + 8 at K t
// and t + 4. Loading K t in every lane, a warp's rows g < 4 and g >= 4 (two neighbouring chunks)
// would meet in 4 chunks of its K lines, two lanes to a bank; lanes g >= 4 load K t + 4 first
// instead, whose chunks the swizzle puts 4 apart, so each load spans 8 chunks, all 32 banks, and
// those lanes swap their two values back. The loads name shared memory: generic loads take
// longer.
template <int kBoxBytes>
__device__ __forceinline__ void load_m_major_tf32_fragment(uint32_t (&a)[4], const void* rows,
                                                           int step) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32 % 4;
  const int g = lane / 4, t = lane % 4, upper = g / 4;
  const uint32_t box = smem_addr(rows) + warp / 2 * kBoxBytes;
  const auto load = [&](int row, int k) {
    uint32_t x;
    const uint32_t at = box + k * 128 + ((row / 4) ^ (k % 8)) * 16 + row % 4 * 4;
    asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(x) : "r"(at) : "memory");
    return x;
  };
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = 16 * (warp % 2) + 8 * h + g;  // in the box
    const uint32_t first = load(row, 8 * step + t + 4 * upper);
    const uint32_t second = load(row, 8 * step + t + 4 * (1 - upper));
    a[h] = upper ? second : first;      // K t
    a[2 + h] = upper ? first : second;  // K t + 4
  }
}

// D[64 x N] (+)= A[64 x 8] B[8 x N] in tf32, float accumulation, both operands K-major tiles in
// shared memory (tf32 has no transposes), given by descriptors as for wgmma_m64k16: a k8 step is
// 32 bytes of K, as a k16 step of 16-bit elements. N is 64, 128, 192 or 256 (rung 9's tiles).
#define MMV_WGMMA_TF32_SS(N, REGS, A, B, SCALE)                                      \
  "{\n.reg .pred p;\nsetp.ne.b32 p, %" #SCALE ", 0;\n"                            \
  "wgmma.mma_async.sync.aligned.m64n" #N "k8.f32.tf32.tf32\n{" REGS "},\n"       \
  "%" #A ", %" #B ", p, 1, 1;\n}\n"
#define MMV_WGMMA_TF32_SS_N(N, REGS, ACC, A, B, SCALE)       \
  asm volatile(MMV_WGMMA_TF32_SS(N, REGS, A, B, SCALE)        \
               : ACC                                        \
               : "l"(a_desc), "l"(b_desc), "r"(scale_d));

template <int N>
__device__ __forceinline__ void wgmma_m64k8_tf32(float (&d)[N / 2], uint64_t a_desc,
                                                 uint64_t b_desc, bool accumulate) {
  const int scale_d = accumulate;
  if constexpr (N == 64) {
    MMV_WGMMA_TF32_SS_N(64, MMV_REGS32, MMV_ACC32(0), 32, 33, 34)
  } else if constexpr (N == 128) {
    MMV_WGMMA_TF32_SS_N(128, MMV_REGS64, MMV_ACC64(0), 64, 65, 66)
  } else if constexpr (N == 192) {
    MMV_WGMMA_TF32_SS_N(192, MMV_REGS96, MMV_ACC96(0), 96, 97, 98)
  } else {
    static_assert(N == 256, "N is 64, 128, 192 or 256 here");
    MMV_WGMMA_TF32_SS_N(256, MMV_REGS128, MMV_ACC128(0), 128, 129, 130)
  }
}

#undef MMV_WGMMA_TF32_SS_N
#undef MMV_WGMMA_TF32_SS
#undef MMV_WGMMA_TF32_N
#undef MMV_WGMMA_TF32
#undef MMV_WGMMA_N
#undef MMV_WGMMA
#undef MMV_REGS128
#undef MMV_REGS96
#undef MMV_REGS80
#undef MMV_REGS64
#undef MMV_REGS32
#undef MMV_REGS16
#undef MMV_REGS8
#undef MMV_REGS4
#undef MMV_ACC128
#undef MMV_ACC96
#undef MMV_ACC80
#undef MMV_ACC64
#undef MMV_ACC32
#undef MMV_ACC16
#undef MMV_ACC8
#undef MMV_ACC4

}  // namespace mm_variants::cuda::hopper
