// PTX wrappers for the sm_80+ tensor-core path: asynchronous global->shared copies (cp.async),
// shared->register fragment loads (ldmatrix) and warp-level MMAs (mma.sync), plus the swizzle
// that keeps the shared-memory tiles free of bank conflicts. Each wrapper is one instruction.
//
// Fragment layouts follow the PTX ISA ("Matrix Fragments for mma.m16n8k16 / m16n8k8"): with
// g = lane / 4 and t = lane % 4, an A fragment holds rows {g, g + 8} and a B fragment column g,
// and the accumulator holds C[g][2t, 2t + 1] and C[g + 8][2t, 2t + 1].
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace mm_variants::cuda::mma {

// The 32-bit shared-state-space address that cp.async and ldmatrix take.
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ---------------------------------------------------------------------------------------------
// cp.async: global -> shared without staging through registers (sm_80+).

// Copies `src_bytes` (0..16) bytes from `src` and zero-fills the rest of the 16-byte destination.
// With src_bytes == 0 nothing is read, which makes it the predicated load of tile edges; `src`
// must still be a valid address, so callers pass the operand's base pointer there.
// Both addresses must be 16-byte aligned. .cg caches in L2 only: the tile is reused from shared.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes)
               : "memory");
}

// Closes the group of cp.async issued since the last commit; groups complete in order.
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// Waits until at most `kPending` of this thread's committed groups are still in flight. Other
// threads' copies become visible only after a barrier that follows the wait.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// ---------------------------------------------------------------------------------------------
// ldmatrix: four 8x8 matrices of 16-bit elements from shared memory into one register each.
// Lanes 8j .. 8j + 7 give the addresses of the eight 16-byte rows of matrix j. Without .trans,
// lane l receives row l / 4, elements 2(l % 4) and 2(l % 4) + 1 of each matrix; with .trans it
// receives column l / 4, rows 2(l % 4) and 2(l % 4) + 1, i.e. the fragment of the transposed
// matrix. For 32-bit data a "row" is four floats and lane l receives element l % 4 of row l / 4,
// which is exactly the tf32 fragment; there is no 32-bit .trans.

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// ---------------------------------------------------------------------------------------------
// mma.sync: D = A * B + D for one warp, A row-major 16 x K, B column-major K x 8, D float 16 x 8.

__device__ __forceinline__ void mma_m16n8k16_f16(float (&d)[4], const uint32_t (&a)[4],
                                                 const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ void mma_m16n8k16_bf16(float (&d)[4], const uint32_t (&a)[4],
                                                  const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// TF32 operands are 32-bit registers whose low 13 mantissa bits the tensor core ignores.
__device__ __forceinline__ void mma_m16n8k8_tf32(float (&d)[4], const uint32_t (&a)[4],
                                                 const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Rounds a float (given as its bits) to the nearest tf32 rather than letting the tensor core
// truncate it. sm_90 rounds ties to even in one instruction; sm_80 has only ties away from zero
// (cvt.rna), which takes three.
__device__ __forceinline__ uint32_t round_to_tf32(uint32_t x) {
  uint32_t r;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm("cvt.rn.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(__uint_as_float(x)));
#else
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(__uint_as_float(x)));
#endif
  return r;
}

// The operand split of 3xTF32 (float32 with TF32 off): x = big + small exactly, big its tf32
// rounding and small the rest, |small| <= 2^-11 |x|. Both are given as raw 32-bit words.
// Where the rounding overflows (x infinite, or finite within half a tf32 step of float32's
// largest value), big is x with its low 13 bits and its exponent's lowest bit cleared: a finite x
// (exponent 254, whose lowest bit is already 0) is truncated to tf32, and an infinity becomes
// +-2^127 with small = x, infinite. Then inf * inf gives inf in all three products, and inf times
// a finite y gives an infinity with the product's sign through small * y_big; where a finite
// product overflows with the other sign (2^127 * y_small), or y_big is 0 (y is 0 or too small
// for tf32), the sum comes out NaN, as float32 would give only for inf * 0 and inf - inf. No
// split of this form can give float32's answer there; those sums are summed again (plain_dot).
struct Tf32Parts {
  uint32_t big, small;
};

__device__ __forceinline__ Tf32Parts split_tf32(uint32_t x) {
  uint32_t big = round_to_tf32(x);
  if (isinf(__uint_as_float(big))) big = x & 0xff7fe000u;
  return {big, __float_as_uint(__uint_as_float(x) - __uint_as_float(big))};
}

// The sum over i < count of x[i * x_step] * y[i * y_step], in float32 FMAs in order: a 3xTF32
// sum that came out NaN, summed again as float32 sums it (split_tf32). It stops at the first NaN,
// which no later product can undo, so NaN inputs cost little here. Only sums with infinities or
// NaN take this path; out of line, it stays away from the registers of the kernels' main loops.
static __device__ __noinline__ float plain_dot(const float* x, int64_t x_step, const float* y,
                                               int64_t y_step, int64_t count) {
  float sum = 0.0f;
  for (int64_t i = 0; i < count && !isnan(sum); ++i) sum = fmaf(x[i * x_step], y[i * y_step], sum);
  return sum;
}

// Two float32 accumulators rounded to nearest (as static_cast<c10::Half> / <c10::BFloat16>
// rounds) into one register of 16-bit elements, x in the low half: a C fragment's pair of
// adjacent outputs, ready for one 4-byte store.
__device__ __forceinline__ uint32_t pack_half2(float x, float y) {
  const __half2 h = __floats2half2_rn(x, y);
  return *reinterpret_cast<const uint32_t*>(&h);
}

__device__ __forceinline__ uint32_t pack_bfloat162(float x, float y) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(x, y);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// ---------------------------------------------------------------------------------------------
// Bank-conflict-free shared tiles by swizzling.
//
// Shared memory serves 128 bytes per cycle in 32 four-byte banks. A tile row of whole 128-byte
// lines keeps each line's eight 16-byte chunks in that line, permuted: chunk c of row r is stored
// at c ^ m(r), m(r) < 8. cp.async then writes every line whole, as global memory delivers it (a
// tile padded by one chunk per row also avoids read conflicts, but its rows straddle lines, and
// the copies into it take over twice the shared-memory cycles and half again the L2 sectors).
// ldmatrix reads one chunk of 8 consecutive rows: m(r) = r % 8 sends them to 8 distinct bank
// groups. Scalar loads of a 32-bit tile stored K-outer read 8 consecutive elements (2 chunks) of
// 4 consecutive rows: m(r) = 2 (r % 4) spreads those over all 32 banks.
template <bool kLdmatrix>
struct Swizzle {
  static constexpr int kPeriod = kLdmatrix ? 8 : 4;  // rows after which m(r) repeats

  // The element offset of element x of row `row` in a tile of kInner-element rows.
  template <int kInner, int kElemBytes>
  __host__ __device__ static constexpr int offset(int row, int x) {
    static_assert(kInner * kElemBytes % 128 == 0, "rows of whole 128-byte lines");
    return row * kInner + (x ^ mask(row) * (16 / kElemBytes));
  }

  // m(row), in chunks.
  __host__ __device__ static constexpr int mask(int row) {
    return kLdmatrix ? row % 8 : 2 * (row % 4);
  }
};

}  // namespace mm_variants::cuda::mma
