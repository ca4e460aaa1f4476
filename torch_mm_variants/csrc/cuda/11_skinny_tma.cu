// Rung 11, skinny_tma: rung 10's decode product, out = x @ w.t() for M <= 128 tokens (rung 10
// takes 64) against an nn.Linear weight w [N, K], with rung 9's Hopper machinery (sm_90a).
//
// Rung 10 gives each block 16 weight rows, and each block reads all of x again from L2: at 32 or
// 64 tokens that is two to four times the weight's own bytes, and its speed falls to 0.55-0.8x
// of torch.mm's at 32 tokens and a fifth to a third at 64. Its fragments also live in
// registers, so more tokens leave room for fewer loads in flight. Here:
// - TMA streams the weight: one producer thread keeps a ring of stages in flight (each up to two
//   boxes of 64 rows x 128 bytes of k, 16 KB of weight), with no registers held: two blocks per
//   SM, or one with a ring twice as deep where that spreads the weight more evenly over the SMs.
//   The copy engine zero-fills rows past N and k past K, so tails need no code.
// - The weight's boxes are read with an L2 evict-first policy. Each of its lines is used once, so
//   L2 gives them up before anything else: streaming the weight neither pushes out lines that
//   later kernels read again nor makes room by writing dirty lines back to memory, a write-back
//   that would share the memory's bandwidth with the weight. With L2 cleared before each call
//   (which leaves it full of dirty lines) 16-bit decode ran 5-12% faster for it, back to back in
//   a CUDA graph 0-4% (H100 and H200).
// - wgmma multiplies them: w's 64 rows are the instruction's M, the tokens (M rounded up to
//   8, 16, 32, 64 or 128) its N, both operands K-major in 128-byte swizzled shared memory. At
//   these sizes the tensor cores are nearly idle whatever M is, so the time is the time to stream
//   w once, up to 64 tokens.
// - x's boxes are exactly its M rows. The copy engine fills rows of a box past the tensor's end
//   with zeros, but slowly: 40 tokens in boxes of 64 rows took 10% longer on 14336 x 4096 than
//   in boxes that end inside the tensor (H200). The tile rows past M are then whatever the ring
//   held; they only make output columns that are never stored (each token is its own column of
//   wgmma's result).
// - Up to 64 tokens a block's x tile (tokens x k) is at most as large as its weight tile, so x
//   adds at most as much L2 traffic as the weight (at 128 tokens, twice as much).
// - Blocks own 64 weight rows and a range of K. When N / 64 blocks cannot fill the GPU, K is
//   split over the blocks of a thread-block cluster (up to 8). Each leaves its float partial tile
//   in its shared memory; after a cluster barrier each block adds a share of the tile over all
//   the blocks' memories (distributed shared memory), in split order, and writes it. Rung 10
//   writes partials to global memory and adds them in a second launch; here they never leave the
//   SMs, which saves that launch and the round trip (15% of the time at 64 tokens on a
//   4096 x 4096 weight). No atomics: the same bits on every run. Clusters stay inside one GPC,
//   so the split count is the largest whose clusters all fit on the GPU at once.
// - A split launch is a programmatic dependent launch: its blocks start, set up their barriers
//   and wait while the kernel before them on the stream finishes (hopper::wait_for_previous_grid
//   comes before any global memory access), and each lets the next kernel start the same way.
//   Back to back in a CUDA graph, as decode runs in serving engines, this hides part of the gap
//   between calls (H200, 16-64 tokens, two runs): 3-7% faster on 4096 x 4096, 12-20% on
//   4096 x 1024, 0-2% on 4096 x 14336. 16-bit unsplit grids start early only where their blocks
//   fill one or both of every SM's two places, or all but an eighth of them (starts_early): the
//   next call's blocks then take the places the last ones leave evenly. There 7680-8192 rows ran
//   1-8% faster for it, 16384-16896 rows up to 4%; 9216-14336 rows (144-224 blocks, two on some
//   SMs and one on others) ran 2-29% slower. Batches in the short-K ring, whose blocks live a few
//   microseconds, start early on heads of 64 up to 32 tokens and on longer ones at 17-32
//   (short_ring_starts_early).
// - A 16-bit single product whose 64-row blocks pass two per SM but not three runs as a loop:
//   a block per SM in the deep ring takes every sms-th row block, its producer filling the ring
//   with the next row block's boxes while the consumer multiplies the last of this one. A grid of
//   a block per row block leaves most SMs with half the bytes in flight in its last wave, and
//   each new block waits for its first boxes; the loop ran 17408-25344-row weights 1-14% faster
//   (loops_over_row_blocks).
// - Unsplit 16-bit products up to 16 tokens start each row block's stream at its own k, round to
//   the start: blocks that all start at k = 0 read one narrow column band of the weight at a
//   time; rotated, 0.7-3.3% faster on an H200 (rotates_k).
// - float32 runs in 3xTF32, as in rung 10, with the weight's fragments split in registers (wgmma
//   takes A from registers) and x's tile split in shared memory, three wgmmas per k8 step. The
//   warpgroup splits the next stage's x while the tensor core multiplies, and each stage is
//   summed afresh and added in float32. On an H200 (both timings) float32 decode from 24 tokens
//   ran at 1.55-2.9x of torch.mm, and at 48-64 tokens 1.2-1.9x as fast as rung 10.
// - A weight stored row-major [K, N] (x @ w, as for a layer that keeps it [in, out]) is read in
//   place: TMA copies its tiles N-major, boxes of one swizzle row of n (64 16-bit elements or 32
//   floats) by a box's k lines, which 16-bit wgmma reads transposed and float32 loads into
//   fragments element by element (hopper::load_m_major_tf32_fragment). A K-contiguous copy, as
//   rung 10 makes, moves the weight twice more before the product streams it: on an H100 auto
//   ran such decode products at 0.06-0.10x of torch.mm in bf16 that way, and reads them at
//   0.98-1.14x in place (docs/performance/decode.md, "Row-major weights").
// - A bmm batch runs in one launch (skinny_tma_batched): the grid's third dimension is the batch
//   entry, and so is the third dimension of x's and w's tensor maps (a single product is a batch
//   of one), each entry's edges filling with zeros as a matrix's do. Rung 10's batched kernel,
//   which reads x again for every 16 weight columns, ran 16-bit p @ v at 24-64 tokens at
//   0.62-0.91x of torch.bmm; this one at 0.89-1.13x (H200; batch_goes_lower has the rest).
//   Batches of short K-contiguous rows (q @ k^T's keys) take a ring of small stages, so that
//   four to eight blocks share an SM (kShortRingMaxK).
// - The sums go out through shared memory, 16 bytes a thread (store_sums): with the tokens as
//   wgmma's N, a thread's sums are scattered over tokens, and where the output is as large as the
//   weight (q @ k^T at 48-64 tokens) storing them one by one cost a third of the time.
// Measured on an H200 (scripts/bench_skinny.py), in 16 bits it streams the large weights at
// 3.0-3.2 TB/s at every M up to 64 with L2 cleared before each call, and at 3.7-3.9 TB/s back to
// back in a CUDA graph: 1.02-1.19x of torch.mm's speed. Up to 16 tokens on weights under 64 MiB
// rung 10's loads stream as fast with L2 cleared, and on an H100 3-5% faster in both timings, so
// `auto` keeps rung 10 there, but where rung 10 splits K and this rung's blocks reach more than
// half the SMs, and in float32 up to 8 or 16 tokens (rung10_is_faster below).
// TMA needs 16-byte aligned rows: an x that is not gets copied (it is small); a K-contiguous w
// that is not takes rung 10's kernel up to 64 tokens (and past them is copied into aligned rows),
// and a row-major one is copied K-contiguous.
#include "common.cuh"
#include "hopper.cuh"
#include "launch.cuh"
#include "mma.cuh"
#include "skinny.cuh"
#include "tensor_map.cuh"

#include <ATen/Context.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <utility>
#include <type_traits>

namespace mm_variants::cuda {
namespace {

constexpr int kRows = 64;                // weight rows of a block: the wgmma M
// Tiles are arrays of 2-byte units whatever the dtype: a box row (one 128-byte swizzle row) is
// 64 units, 64 16-bit elements or 32 floats.
constexpr int kRowUnits = kTmaRowBytes / 2;
constexpr int kThreads = 128 + 32;       // the consumer warpgroup, then the producer warp
constexpr int kMaxSplits = 8;  // the largest portable cluster
// The ring's shape: boxes per stage, each one swizzle row of k (more make longer runs of each
// weight row per stage), and the shared memory of a block in its two sizes: 96 KB, two blocks per
// SM, or 192 KB, one block per SM with a ring twice as deep. The host takes whichever leaves the
// least k for the busiest SM to stream (plan() below). MM_VARIANTS_SKINNY_TMA, predefined,
// overrides them for a sweep.
#ifndef MM_VARIANTS_SKINNY_TMA  // BOXES, SHARED_SMEM_KB, ALONE_SMEM_KB
#define MM_VARIANTS_SKINNY_TMA 2, 96, 192
#endif
constexpr int kShape[] = {MM_VARIANTS_SKINNY_TMA};

// The stage ring for dtype T and TOKENS columns of x (the wgmma N) in SMEM_KB of shared memory:
// per stage, kBoxes weight boxes of 64 rows x one swizzle row of k (64 16-bit elements or 32
// floats) and as many x slots of TOKENS rows (each filled by a box of x's M rows), and as many
// stages as fit. float32 has two x slots per box: x's tf32 part and the rest (see multiply_3xtf32).
template <typename T, int TOKENS, int SMEM_KB>
struct Ring {
  // x's columns (the wgmma N). A function, not a constant: the compiler's passes that never read
  // it (host, sm_80) would flag a constant as unused.
  __host__ __device__ static constexpr int tokens() { return TOKENS; }
  static constexpr int kSmemPerBlock = SMEM_KB * 1024;
  // Whether two blocks of this ring fit on an SM (all but the deep ring).
  static constexpr bool kTwoPerSm = 2 * SMEM_KB <= kShape[2];
  static constexpr int kWBox = kRows * kRowUnits, kXBox = TOKENS * kRowUnits;  // 2-byte units
  static constexpr int kXSlots = std::is_same_v<T, float> ? 2 : 1;
  // At least kMinStages stages of kBoxes boxes each must fit. float32 holds a stage while it
  // splits the next one's x (see consume), so a ring of two would hold all of it.
  static constexpr int kMinStages = std::is_same_v<T, float> ? 3 : 2;
  static constexpr int kBoxes = std::max(
      1, std::min(kShape[0], kSmemPerBlock / (kMinStages * (kWBox + kXSlots * kXBox) * 2)));
  static constexpr int kWTile = kBoxes * kWBox, kXTile = kBoxes * kXBox;
  static constexpr int kBoxK = kTmaBoxInnerOf<T>;  // k of a box
  // A weight box read N-major (a row-major [K, N] weight): n_boxes() boxes of kBoxK rows of n
  // (one swizzle row) by kBoxK lines of k, n_box_units() apart. Functions, as tokens().
  __host__ __device__ static constexpr int n_boxes() { return kRows / kBoxK; }
  __host__ __device__ static constexpr int n_box_units() { return kBoxK * kRowUnits; }
  static constexpr int kStepK = kBoxes * kBoxK;     // k of a stage
  static constexpr int kStageBytes = (kWTile + kXSlots * kXTile) * 2;
  static constexpr int kStages = kSmemPerBlock / kStageBytes;
  static constexpr int kSmemBytes = kStages * kStageBytes + 2 * kStages * 8 + 1024;  // + align
  static_assert(kStages >= kMinStages && (kXBox * 2) % 1024 == 0,
                "a ring; boxes start on swizzle atoms");
};
// Below this many stages a split leaves its ring half empty.
constexpr int kMinStepsPerSplit = 4;

// A K-major tile's step-th 32 bytes of k (a k16 step of 16-bit elements, a k8 step of tf32) as
// a wgmma operand: 128-byte rows, 8-row atoms 1024 bytes apart.
[[maybe_unused]] __device__ __forceinline__ uint64_t k_major_step(const uint16_t* tile,
                                                                  int step) {
  return hopper::smem_descriptor(tile + 16 * step, 16, 1024);
}

// An N-major weight tile's step-th 16 lines of k (a k16 step) as wgmma's A (transposed): lines of
// 64 rows in 128 bytes, 8-line atoms 1024 bytes apart (the leading offset, between boxes of 64
// rows, is unused at 64 rows).
[[maybe_unused]] __device__ __forceinline__ uint64_t n_major_step(const uint16_t* tile,
                                                                  int step) {
  return hopper::smem_descriptor(tile + 16 * kRowUnits * step, kRows * kTmaRowBytes, 1024);
}

// The producer thread: steps `steps` stages of k from `step0`, each once its slot is free, the
// first at ring position `first` (a block that loops over row blocks goes on round the ring),
// starting `rotation` stages in and coming round to step0 (rotates_k; the consumer's sums do not
// depend on which k a stage holds, only its order of additions does). x's
// boxes hold its M rows only (the host sizes x's map so), the rest of their tiles is left as it
// is (see the file's header); TMA counts the bytes it delivers, so M sets each stage's total.
// kWKMajor: the weight's boxes are 64 rows of k; otherwise n_boxes() boxes of k lines of n.
// The boxes come from batch entry x_entry of x's map and w_entry of w's (0 for a single product).
template <class R, bool kWKMajor>
__device__ void produce(const CUtensorMap* w_map, const CUtensorMap* x_map, uint16_t* w_tiles,
                        uint16_t* x_tiles, uint64_t* full, uint64_t* empty, int n0, int step0,
                        int steps, int first, int rotation, int M, int x_entry, int w_entry) {
  const uint32_t stage_bytes = (R::kWTile + R::kBoxes * M * kRowUnits) * 2;
  const hopper::L2Policy read_once = hopper::l2_evict_first();
  for (int i = 0; i < steps; ++i) {
    const int at = first + i, s = at % R::kStages;
    const int k0 = (step0 + (i + rotation) % steps) * R::kStepK;
    hopper::mbarrier_wait(&empty[s], ((at / R::kStages) & 1) ^ 1);
    hopper::mbarrier_arrive_expect_tx(&full[s], stage_bytes);
#pragma unroll
    for (int b = 0; b < R::kBoxes; ++b) {
      const int k = k0 + b * R::kBoxK;
      uint16_t* w_box = w_tiles + s * R::kWTile + b * R::kWBox;
      if constexpr (kWKMajor) {
        hopper::tma_load_3d(w_box, w_map, &full[s], k, n0, w_entry, read_once);
      } else {
#pragma unroll
        for (int j = 0; j < R::n_boxes(); ++j) {
          hopper::tma_load_3d(w_box + j * R::n_box_units(), w_map, &full[s], n0 + j * R::kBoxK, k,
                              w_entry, read_once);
        }
      }
      hopper::tma_load_3d(x_tiles + s * R::kXTile + b * R::kXBox, x_map, &full[s], k, 0, x_entry);
    }
  }
}

// Thread (warp v, lane 4g + t) holds d[4j + 2h + e] = out[token 8j + 2t + e][row n0 + 16v + g + 8h]
// (hopper.cuh's accumulator layout with the weight rows as wgmma's M). f(token, row, value) gets
// each of them.
template <int TOKENS, class F>
__device__ __forceinline__ void for_each_sum(const float (&d)[TOKENS / 2], const F& f) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
  for (int j = 0; j < TOKENS / 8; ++j) {
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      f(8 * j + 2 * (lane % 4) + q % 2, 16 * warp + lane / 4 + 8 * (q / 2), d[4 * j + q]);
    }
  }
}

// A split's partial tile in shared memory: [token][row] floats. The pitch puts the 32 values of
// one for_each_sum step in 32 different banks.
[[maybe_unused]] constexpr int kPartialPitch = kRows + 4;

// A whole K's sums, out[m][n0 .. n0 + 63] for every token m, rounded to T, go to global memory
// through shared memory (the ring, free by now): each token's 64 values are 8 (16-bit) or 16
// (float) runs of 16 bytes, stored whole, 8 or 16 threads to a token's 128 or 256 bytes. Stored
// from the accumulators directly, a warp's store instruction covers 16 bytes of each of 4 tokens
// (2 bytes a thread in 16 bits). That matters where the output is as large as the weight: on keys
// of 64 at 64 tokens (q @ k^T), a tile's output is as large as its weight tile, and there the
// direct stores ran at 0.64x of torch.bmm, these at 0.90x (32 x [4096, 64], H200).
// In the staging tile, run c of token m sits at run c ^ (m % 8) of the token's line, so that the
// 4 tokens of a warp's accumulator store fall in different banks.
// float32: of four sums of token m, columns n .. n + 3 (up to N - 1), those that 3xTF32 gave as
// NaN (perhaps infinities it cannot give, mma::split_tf32) summed again (sum_again(m, n)).
template <class SumAgain>
__device__ __forceinline__ void sum_nans_again(float* sums, int m, int n, int N,
                                               const SumAgain& sum_again) {
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    if (isnan(sums[e]) && n + e < N) sums[e] = sum_again(m, n + e);
  }
}

template <typename T, int TOKENS, class SumAgain>
__device__ __forceinline__ void store_sums(const float (&d)[TOKENS / 2], uint8_t* tile, T* out,
                                           int M, int N, int n0, const SumAgain& sum_again) {
  constexpr int kRunElems = 16 / sizeof(T), kRuns = kRows / kRunElems;
  constexpr int kLine = kRows * sizeof(T);
  const auto at = [&](int m, int run) { return tile + m * kLine + ((run ^ (m % 8)) << 4); };
  for_each_sum<TOKENS>(d, [&](int m, int row, float v) {
    *reinterpret_cast<T*>(at(m, row / kRunElems) + row % kRunElems * sizeof(T)) =
        static_cast<T>(v);
  });
  hopper::named_barrier_sync(1, 128);
  // Whole runs where out's rows start 16-byte aligned; element by element otherwise.
  const bool whole = N % kRunElems == 0 && reinterpret_cast<uintptr_t>(out) % 16 == 0;
  for (int i = threadIdx.x; i < M * kRuns; i += 128) {
    const int m = i / kRuns, run = i % kRuns, row = n0 + run * kRunElems;
    if (row >= N) continue;
    if constexpr (std::is_same_v<T, float>) {
      sum_nans_again(reinterpret_cast<float*>(at(m, run)), m, row, N, sum_again);
    }
    T* to = out + static_cast<int64_t>(m) * N + row;
    if (whole) {
      *reinterpret_cast<uint4*>(to) = *reinterpret_cast<const uint4*>(at(m, run));
    } else {
      const T* from = reinterpret_cast<const T*>(at(m, run));
      for (int e = 0; e < kRunElems && row + e < N; ++e) to[e] = from[e];
    }
  }
}

// The same sums stored from the accumulators, element by element, where the ring is still
// streaming the block's next row block (a block that loops, plan_loop): at the token counts it
// loops for, a tile's sums are a few hundredths of its weight's bytes.
template <typename T, int TOKENS>
__device__ __forceinline__ void store_sums_in_place(const float (&d)[TOKENS / 2], T* out, int M,
                                                    int N, int n0) {
  for_each_sum<TOKENS>(d, [&](int m, int row, float v) {
    if (m < M && n0 + row < N) out[static_cast<int64_t>(m) * N + n0 + row] = static_cast<T>(v);
  });
}

// d (+)= a stage's product, 16-bit: the weight tile is wgmma's A (K-major, or N-major read
// transposed), the x tile its B, both straight from shared memory.
template <typename T, class R, bool kWKMajor>
__device__ __forceinline__ void multiply_16bit(float (&d)[R::tokens() / 2], const uint16_t* w,
                                               const uint16_t* x, bool accumulate) {
  constexpr bool kBf16 = std::is_same_v<T, c10::BFloat16>;
  constexpr int kStepsPerBox = kRowUnits / 16;
  hopper::wgmma_fence();
#pragma unroll
  for (int k16 = 0; k16 < R::kStepK / 16; ++k16) {
    const int box = k16 / kStepsPerBox, step = k16 % kStepsPerBox;
    const uint16_t* w_box = w + box * R::kWBox;
    const uint64_t w_step = kWKMajor ? k_major_step(w_box, step) : n_major_step(w_box, step);
    hopper::wgmma_m64k16<R::tokens(), kBf16, !kWKMajor, false>(
        d, w_step, k_major_step(x + box * R::kXBox, step), accumulate || k16 > 0);
  }
  hopper::wgmma_commit();
}

// float32 runs in 3xTF32 as rung 10 does: each operand is its tf32 rounding (big) plus the exact
// rest (small), and big*big + small*big + big*small leaves out only small*small, about 2^-22 of
// the product. The tensor core reads small's top 19 bits only, an error of at most 2^-21. wgmma
// takes B (x) from shared memory only, so the warpgroup first splits a stage's x slot in place
// (big) and into the stage's second slot (small). x's rows past M are not filled by TMA and only
// make outputs that are never stored.
template <class R>
__device__ __forceinline__ void split_x(uint16_t* x, uint16_t* x_small, int M) {
  for (int b = 0; b < R::kBoxes; ++b) {
    auto* big = reinterpret_cast<float4*>(x + b * R::kXBox);
    auto* small = reinterpret_cast<float4*>(x_small + b * R::kXBox);
    for (int i = threadIdx.x; i < M * (kTmaRowBytes / 16); i += 128) {
      float4 v = big[i], rest;
      float* e = &v.x;
      float* r = &rest.x;
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const mma::Tf32Parts split = mma::split_tf32(__float_as_uint(e[q]));
        e[q] = __uint_as_float(split.big);
        r[q] = __uint_as_float(split.small);
      }
      big[i] = v;
      small[i] = rest;
    }
  }
  hopper::fence_async_shared();  // the ordinary stores, before wgmma reads them
  hopper::named_barrier_sync(1, 128);
}

// d = a stage's product in 3xTF32, x split already. The weight goes to wgmma from registers, so
// each lane splits its own fragments, loaded with ldmatrix from the swizzled K-major tile, or
// element by element from an N-major one (hopper::load_m_major_tf32_fragment).
template <class R, bool kWKMajor>
__device__ __forceinline__ void multiply_3xtf32(float (&d)[R::tokens() / 2], const uint16_t* w,
                                                const uint16_t* x, const uint16_t* x_small) {
  constexpr int kK8PerBox = R::kBoxK / 8;
  uint32_t a_big[R::kStepK / 8][4], a_small[R::kStepK / 8][4];
#pragma unroll
  for (int k8 = 0; k8 < R::kStepK / 8; ++k8) {
    const int box = k8 / kK8PerBox;
    uint32_t raw[4];
    if constexpr (kWKMajor) {
      // Lane l addresses row l % 8 of 8 x 16-byte matrix l / 8: rows 0-7 and 8-15 of the warp's
      // 16 (matrices 0, 1) at k 0-3, then at k 4-7 (2, 3): a0 .. a3 of the tf32 fragment.
      const int lane = threadIdx.x % 32;
      const int row = 16 * (threadIdx.x / 32) + lane % 8 + 8 * (lane / 8 % 2);
      const int chunk = 2 * (k8 % kK8PerBox) + lane / 16;
      mma::ldmatrix_x4(raw, mma::smem_addr(w + box * R::kWBox) + row * kTmaRowBytes +
                                ((chunk ^ (row % 8)) << 4));
    } else {
      hopper::load_m_major_tf32_fragment<R::n_box_units() * 2>(raw, w + box * R::kWBox,
                                                               k8 % kK8PerBox);
    }
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const mma::Tf32Parts split = mma::split_tf32(raw[q]);
      a_big[k8][q] = split.big;
      a_small[k8][q] = split.small;
    }
  }
  hopper::wgmma_fence();
#pragma unroll
  for (int k8 = 0; k8 < R::kStepK / 8; ++k8) {
    const int box = k8 / kK8PerBox, step = k8 % kK8PerBox;
    const uint64_t xb = k_major_step(x + box * R::kXBox, step);
    const uint64_t xs = k_major_step(x_small + box * R::kXBox, step);
    hopper::wgmma_m64k8_tf32<R::tokens()>(d, a_small[k8], xb, k8 > 0);
    hopper::wgmma_m64k8_tf32<R::tokens()>(d, a_big[k8], xs, true);
    hopper::wgmma_m64k8_tf32<R::tokens()>(d, a_big[k8], xb, true);
  }
  hopper::wgmma_commit();
}

// Where a bmm batch's entries lie: entry e (blockIdx.z) reads its boxes at coordinate e of the
// third dimension of x's map and of w's (0 where the entries share one weight), and writes its
// [M, N] output `out` elements past entry 0's. A single product is a batch of one entry.
struct Entries {
  int64_t out = 0;
  bool shared_w = true;
  // float32: what the maps read, as plain memory (x's rows; w's rows, K-major, or its k lines),
  // entry 0's and the entries' strides in elements: for the sums 3xTF32 cannot give.
  const void* x = nullptr;
  int64_t ldx = 0, x_entry = 0;
  const void* w = nullptr;
  int64_t ldw = 0, w_entry = 0;
};

// An entry's float32 operands as plain memory: a sum that 3xTF32 gave as NaN, perhaps an
// infinity it cannot give (mma::split_tf32), is summed again from them over the whole K.
template <bool kWKMajor>
struct PlainOperands {
  const float* x;
  int64_t ldx;
  const float* w;
  int64_t ldw;
  int K;

  __device__ PlainOperands(const Entries& e, int entry, int K)
      : x(static_cast<const float*>(e.x) + entry * e.x_entry),
        ldx(e.ldx),
        w(static_cast<const float*>(e.w) + (e.shared_w ? 0 : entry * e.w_entry)),
        ldw(e.ldw),
        K(K) {}

  __device__ float sum(int m, int n) const {
    return kWKMajor ? mma::plain_dot(x + m * ldx, 1, w + n * ldw, 1, K)
                    : mma::plain_dot(x + m * ldx, 1, w + n, ldw, K);
  }
};

// The consumer warpgroup: multiplies `steps` stages as they land from ring position `first`,
// freeing each slot at once, then writes its sums to out (a whole K; through the ring if
// `ring_free`, no further row block of the block's streaming into it) or as the partial tile at
// `partial` (a split). float32 sums
// each stage afresh and adds that into the running sums in float32 (as rung 10 does: the tensor
// core's own additions keep fewer bits), and splits the next stage's x while the tensor core
// multiplies. Where its sums are stored whole, one that came out NaN is summed again
// (sum_again, sum_nans_again).
template <typename T, class R, bool kWKMajor, class SumAgain>
__device__ __forceinline__ void consume(uint16_t* w_tiles, uint16_t* x_tiles,
                                        uint16_t* x_small_tiles, uint64_t* full, uint64_t* empty,
                                        int steps, int first, bool ring_free, T* out,
                                        float* partial, int M, int N, int n0,
                                        const SumAgain& sum_again) {
  constexpr int TOKENS = R::tokens();
  constexpr bool kFloat = std::is_same_v<T, float>;
  float d[TOKENS / 2], fresh[kFloat ? TOKENS / 2 : 1];
  const auto wait_for_stage = [&](int i) {
    hopper::mbarrier_wait(&full[i % R::kStages], (i / R::kStages) & 1);
  };
  if constexpr (kFloat) {
#pragma unroll
    for (int q = 0; q < TOKENS / 2; ++q) d[q] = 0.f;
    wait_for_stage(first);
    split_x<R>(x_tiles + first % R::kStages * R::kXTile,
               x_small_tiles + first % R::kStages * R::kXTile, M);
  }
  for (int i = 0; i < steps; ++i) {
    const int s = (first + i) % R::kStages;
    const uint16_t* w = w_tiles + s * R::kWTile;
    uint16_t* x = x_tiles + s * R::kXTile;
    if constexpr (kFloat) {
      multiply_3xtf32<R, kWKMajor>(fresh, w, x, x_small_tiles + s * R::kXTile);
      if (i + 1 < steps) {
        const int next = (first + i + 1) % R::kStages;
        wait_for_stage(first + i + 1);
        split_x<R>(x_tiles + next * R::kXTile, x_small_tiles + next * R::kXTile, M);
      }
    } else {
      wait_for_stage(first + i);
      hopper::fence_registers(d);
      multiply_16bit<T, R, kWKMajor>(d, w, x, i > 0);
    }
    // The multiply is short next to a tile's trip from memory: wait for it and free the slot.
    hopper::wgmma_wait<0>();
    if constexpr (kFloat) {
      hopper::fence_registers(fresh);
#pragma unroll
      for (int q = 0; q < TOKENS / 2; ++q) d[q] += fresh[q];
    } else {
      hopper::fence_registers(d);
    }
    if (threadIdx.x % 32 == 0) hopper::mbarrier_arrive(&empty[s]);
  }
  static_assert(TOKENS * kPartialPitch * sizeof(float) <= R::kStages * R::kStageBytes &&
                TOKENS * kRows * sizeof(T) <= R::kStages * R::kStageBytes);
  // The sums overwrite the ring: every warp's last multiply must have read it first.
  hopper::named_barrier_sync(1, 128);
  if (partial != nullptr) {
    for_each_sum<TOKENS>(d, [&](int m, int row, float v) { partial[m * kPartialPitch + row] = v; });
  } else if (ring_free || kFloat) {  // float32 never loops over row blocks (plan_loop)
    store_sums<T, TOKENS>(d, reinterpret_cast<uint8_t*>(w_tiles), out, M, N, n0, sum_again);
  } else {
    store_sums_in_place<T, TOKENS>(d, out, M, N, n0);
  }
}

// Four sums of a token's consecutive weight rows, row `row` of the block's first, rounded to T and
// stored one element at a time, up to row N - 1.
template <typename T>
__device__ __forceinline__ void store_four_elements(float4 sum, T* out, int m, int N, int n0,
                                                    int row) {
  const float values[4] = {sum.x, sum.y, sum.z, sum.w};
  T* to = out + static_cast<int64_t>(m) * N + n0 + row;
  for (int e = 0; e < 4 && n0 + row + e < N; ++e) to[e] = static_cast<T>(values[e]);
}

// The same in one 8-byte store where out's rows start 8-byte aligned (N % 4 == 0; out is
// allocated by the op).
template <typename T>
__device__ __forceinline__ void store_four(float4 sum, T* out, int m, int N, int n0, int row) {
  if (N % 4 == 0 && n0 + row < N) {
    const float values[4] = {sum.x, sum.y, sum.z, sum.w};
    Vec<T, 4> v;
#pragma unroll
    for (int e = 0; e < 4; ++e) v.v[e] = static_cast<T>(values[e]);
    *reinterpret_cast<Vec<T, 4>*>(out + static_cast<int64_t>(m) * N + n0 + row) = v;
  } else {
    store_four_elements(sum, out, m, N, n0, row);
  }
}

// The cluster's sums of out[m][n0 .. n0 + 63], this block's share of them: runs of four rows of a
// token, every `splits`-th group of kThreads runs, each added over every block's partial tile in
// rank (split) order.
template <typename T, class SumAgain>
__device__ void sum_cluster_partials(const float* partial, T* out, int M, int N, int n0,
                                     const SumAgain& sum_again) {
  constexpr int kQuads = kRows / 4;
  const int splits = static_cast<int>(gridDim.y), rank = static_cast<int>(blockIdx.y);
  const int runs = M * kQuads, stride = splits * kThreads;
  const auto run_at = [&](int i, int split) {
    return hopper::cluster_smem_addr(partial + i / kQuads * kPartialPitch + i % kQuads * 4, split);
  };
  // At most one run per thread: the plain loop (the batched one below, even with one run, was
  // 2-5% slower at 16 tokens).
  if (runs <= stride) {
    const int i = rank * kThreads + threadIdx.x;
    if (i >= runs) return;
    float4 sum = hopper::ld_cluster_float4(run_at(i, 0));
    for (int s = 1; s < splits; ++s) {
      const float4 v = hopper::ld_cluster_float4(run_at(i, s));
      sum = make_float4(sum.x + v.x, sum.y + v.y, sum.z + v.z, sum.w + v.w);
    }
    if constexpr (std::is_same_v<T, float>) {
      sum_nans_again(&sum.x, i / kQuads, n0 + i % kQuads * 4, N, sum_again);
    }
    store_four_elements(sum, out, i / kQuads, N, n0, i % kQuads * 4);
    return;
  }
  // Several runs per thread: kBatch of them are loaded from a split before any is added, so that
  // their trips to the other SMs overlap. One run at a time, the adding took 1.1 us of the 12 that
  // 64 tokens on a 4096 x 4096 weight take (2 splits, H200; clock64 stamps per block).
  constexpr int kBatch = 4;
  for (int first = rank * kThreads + threadIdx.x; first < runs; first += kBatch * stride) {
    float4 sum[kBatch];
    for (int s = 0; s < splits; ++s) {
      float4 v[kBatch];
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const int i = first + b * stride;
        v[b] = i < runs ? hopper::ld_cluster_float4(run_at(i, s)) : make_float4(0.f, 0.f, 0.f, 0.f);
      }
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        sum[b] = s == 0 ? v[b]
                        : make_float4(sum[b].x + v[b].x, sum[b].y + v[b].y, sum[b].z + v[b].z,
                                      sum[b].w + v[b].w);
      }
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int i = first + b * stride;
      if (i >= runs) continue;
      if constexpr (std::is_same_v<T, float>) {
        sum_nans_again(&sum[b].x, i / kQuads, n0 + i % kQuads * 4, N, sum_again);
      }
      store_four(sum[b], out, i / kQuads, N, n0, i % kQuads * 4);
    }
  }
}

// Block (blockIdx.x, blockIdx.y, blockIdx.z): weight rows 64 bx .. 64 bx + 63 over k steps
// by * steps_per_split onwards (the host makes every split non-empty) of batch entry bz, and
// where the grid has fewer columns than the weight has row blocks, every gridDim.x-th row block
// after (plan_loop; unsplit only). With more than one split, the gridDim.y blocks of a column
// form one cluster, rank blockIdx.y. With `rotate_k`, row block b streams its k from step
// b % steps round to the start (rotates_k).
// kWKMajor: w_map copies the weight K-major (w [N, K]), otherwise N-major (a row-major [K, N]
// weight, in place).
template <typename T, class R, bool kWKMajor>
__global__ void __launch_bounds__(kThreads)
    skinny_tma_kernel(const __grid_constant__ CUtensorMap w_map,
                      const __grid_constant__ CUtensorMap x_map, T* out, int M, int N, int K,
                      int steps_per_split, bool rotate_k, Entries entries) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>(
      (reinterpret_cast<uintptr_t>(smem_raw) + 1023) / 1024 * 1024);  // swizzle atoms
  uint16_t* w_tiles = reinterpret_cast<uint16_t*>(smem);
  uint16_t* x_tiles = w_tiles + R::kStages * R::kWTile;
  uint16_t* x_small_tiles = x_tiles + R::kStages * R::kXTile;  // float32 only
  uint64_t* full = reinterpret_cast<uint64_t*>(x_tiles + R::kXSlots * R::kStages * R::kXTile);
  uint64_t* empty = full + R::kStages;
  // A split's partial tile takes the ring's place once every stage has been multiplied.
  float* partial = gridDim.y > 1 ? reinterpret_cast<float*>(smem) : nullptr;

  const int n0 = blockIdx.x * kRows;
  const int step0 = blockIdx.y * steps_per_split;
  const int entry = static_cast<int>(blockIdx.z);
  out += entry * entries.out;
  const int steps = min(steps_per_split, (K - 1) / R::kStepK + 1 - step0);
  if (threadIdx.x == 0) {
    hopper::prefetch_tensor_map(&w_map);
    hopper::prefetch_tensor_map(&x_map);
    for (int s = 0; s < R::kStages; ++s) {
      hopper::mbarrier_init(&full[s], 1);
      hopper::mbarrier_init(&empty[s], 4);  // one arrival per consumer warp
    }
    hopper::fence_barrier_init();
  }
  __syncthreads();
  // Launched early (starts_early), the block has set up its barriers while the previous kernel
  // finished; x may be that kernel's output, and out may be memory it still reads.
  hopper::wait_for_previous_grid();
  hopper::allow_next_grid();

  // float32: a whole K's sum out[m][n] again in float32, from the operands' plain memory, built
  // where it is needed so that no register holds it meanwhile.
  const auto sum_again = [&](int m, int n) {
    return PlainOperands<kWKMajor>(entries, blockIdx.z, K).sum(m, n);
  };
  const int stride = static_cast<int>(gridDim.x), row_blocks = (N - 1) / kRows + 1;
  if (threadIdx.x < 128) {
    for (int b = blockIdx.x, first = 0; b < row_blocks; b += stride, first += steps) {
      consume<T, R, kWKMajor>(w_tiles, x_tiles, x_small_tiles, full, empty, steps, first,
                              b + stride >= row_blocks, out, partial, M, N, b * kRows, sum_again);
    }
  } else if (threadIdx.x == 128) {
    for (int b = blockIdx.x, first = 0; b < row_blocks; b += stride, first += steps) {
      produce<R, kWKMajor>(&w_map, &x_map, w_tiles, x_tiles, full, empty, b * kRows, step0, steps,
                           first, rotate_k ? b % steps : 0, M, entry,
                           entries.shared_w ? 0 : entry);
    }
  }
  if (partial != nullptr) {
    __syncwarp();            // the producer warp reconverges for the aligned barrier
    hopper::cluster_sync();  // every block's partial tile is written
    sum_cluster_partials(partial, out, M, N, n0, sum_again);
    hopper::cluster_sync();  // and read: no block may leave while others read its tile
  }
#endif
}

// A launch of the kernel with ring R: its K split, its grid, the blocks on the busiest SM and the
// k that SM streams. Streaming is what takes the time, so that k is what the host compares
// between the two rings (launch_rings).
struct Plan {
  int per_split;
  dim3 grid;
  int64_t busiest_blocks;
  int64_t busiest_k;
  bool early;
  bool rotated;
};

// The blocks of a launch of `blocks` blocks in `splits` K splits that the busiest SM runs. The
// block scheduler gives every SM a block before any gets a second, but 16-bit launches of the
// two-per-SM ring split over clusters ran as if two of their blocks shared an SM as soon as
// there were more blocks than half the SMs. On an H200 (CUDA graphs, weights rotated past L2,
// bf16 at 8-64 tokens), where both rings' launches spread one block per SM, the deep ring ran
// 1.20-1.33 times as fast on 1024 x 4096 and 1024 x 8192 weights (shared ring 128 blocks, deep
// ring 96), 1.18-1.25 on 2048 x 2048 (128 against 96), 1.26-1.27 on p @ v over 8 x [8192, 128]
// values (128 against 96); with 64 blocks the two-per-SM ring held its own (1024 x 2048:
// 1.01-1.06 times the deep ring's speed; p @ v over 4 x [8192, 128] values: 1.16).
template <typename T, class R>
int64_t busiest_sm_blocks(int64_t blocks, int64_t splits, int sms) {
  const int64_t spread = ceil_div(blocks, sms);
  const bool paired = sizeof(T) == 2 && R::kTwoPerSm && splits > 1 && 2 * blocks > sms;
  return paired ? std::max<int64_t>(spread, 2) : spread;
}

// Whether `blocks` blocks fill one place on every SM, or two, but for at most an eighth of the
// SMs' places.
bool fills_the_sms_evenly(int64_t blocks, int sms) {
  if (blocks > 2 * sms) return false;
  const int64_t idle = (blocks <= sms ? sms : 2 * sms) - blocks;
  return 8 * idle <= sms;
}

// Whether a launch of `blocks` blocks in `splits` K splits starts early (a programmatic dependent
// launch, see the file's header): every split one, and a 16-bit single product of the two-per-SM
// ring whose blocks fill the SMs evenly. Otherwise the next call's first blocks take the places
// the SMs with one block have spare, and pile up there. Back to back in a CUDA graph (H200, bf16
// and fp16, 1-64 tokens, weights rotated past L2), starting early took K = 4096 weights of 7680
// and 8192 rows (120 and 128 blocks) from 1.00-1.08x of torch.mm to 1.03-1.11x, 8192 x 2048 from
// 1.00-1.04x to 1.07-1.12x, 16384 and 16896 rows (K = 2048 and 4096; 256 and 264 blocks) from
// 0.97-1.09x to 0.99-1.10x. It cost 8-29% on 9216-12288 rows (144-192 blocks), 2-10% on 13312
// and 14336 (208 and 224), and up to 7% on 28672 (448 blocks, past both places); 15360 and
// 20480 rows (240 and 320 blocks) moved by 2% or less.
template <typename T, class R>
bool starts_early(int64_t blocks, int64_t splits, int64_t entries, int sms) {
  if (splits > 1) return true;
  return sizeof(T) == 2 && R::kTwoPerSm && entries == 1 && fills_the_sms_evenly(blocks, sms);
}

// Whether each row block streams its k from its own step (row block b from step b % steps, round
// to the start) instead of all of them from k = 0: 16-bit single products, unsplit, up to 16
// tokens. With every block at the same k, the SMs read one narrow column band of the weight at a
// time, a few hundred bytes of every row; rotated, their reads spread over the whole weight.
// Back to back in a CUDA graph (H200, weights rotated past L2, 1 and 16 tokens, torch.mm beside
// each, one round) it ran 14336 x 4096 1.8-3.0% faster in bf16 and 1.0-1.1% in fp16, 17408 x
// 4096 (the loop) 1.4-3.3%, 28672 x 4096 at 16 tokens 1.8-3.0% (at 1 token within 0.4%), 14336
// x 4096 stored row-major 0.7-0.9%. At 64 tokens it moved them from 1.2% faster to 2.2% slower;
// K splits (4096 x 4096, 4096 x 14336) moved by under 1% at 1-16 tokens and lost 3-4% at 64, so
// they keep k in order.
template <typename T, class R>
constexpr bool rotates_k(int64_t splits, int64_t entries) {
  return sizeof(T) == 2 && R::tokens() <= 16 && splits == 1 && entries == 1;
}

// `entries`: of a bmm batch, whose blocks all count (one column of blocks per entry's 64 rows).
template <typename T, class R, bool kWKMajor>
Plan plan(int64_t N, int64_t K, int64_t entries, int sms) {
  const int64_t row_blocks = ceil_div(N, kRows), k_steps = ceil_div(K, R::kStepK);
  const int per_split =
      steps_per_split(skinny_tma_kernel<T, R, kWKMajor>, kThreads, R::kSmemBytes, 1,
                      row_blocks * entries, k_steps, kMaxSplits, kMinStepsPerSplit);
  const int64_t splits = ceil_div(k_steps, per_split);
  const int64_t blocks = row_blocks * entries * splits;
  const int64_t busiest = busiest_sm_blocks<T, R>(blocks, splits, sms);
  return {per_split,
          dim3(static_cast<unsigned>(row_blocks), static_cast<unsigned>(splits),
               static_cast<unsigned>(entries)),
          busiest, busiest * per_split * R::kStepK,
          starts_early<T, R>(blocks, splits, entries, sms), rotates_k<T, R>(splits, entries)};
}

template <typename T, class R, bool kWKMajor>
void launch(const Plan& p, const CUtensorMap& w_map, const CUtensorMap& x_map, T* out,
            const Entries& entries, int64_t M, int64_t N, int64_t K) {
  auto* kernel = skinny_tma_kernel<T, R, kWKMajor>;
  allow_dynamic_smem(kernel, R::kSmemBytes);
  // With more than one split, each column of blocks is a cluster (of one otherwise).
  KernelLaunch cluster_launch(p.grid, kThreads, R::kSmemBytes);
  cluster_launch.in_clusters(dim3(1, p.grid.y)).starting_early(p.early);
  cluster_launch.run(kernel, w_map, x_map, out, static_cast<int>(M), static_cast<int>(N),
                     static_cast<int>(K), p.per_split, p.rotated, entries);
}

// A map over `entries` matrices entry_ld elements apart (a bmm batch), or over one (a single
// product, or a weight the entries share), whose entry pitch is then its own span, never used.
template <typename T>
CUtensorMap entries_map(const T* data, int64_t inner, int64_t outer, int64_t ld, int box_outer,
                        int64_t entries, int64_t entry_ld) {
  if (entries <= 1) return batch_tile_map(data, inner, outer, ld, box_outer, 1, outer * ld);
  return batch_tile_map(data, inner, outer, ld, box_outer, entries, entry_ld);
}

// The weight as TMA copies it: the K-contiguous w = b.t() [N, K] in boxes of 64 rows of k
// (k_major), or a row-major b [K, N], read in place, in boxes of k lines of n; for a bmm batch,
// every entry's (unless they share one). `data` holds the memory the map points at: where b had
// to be copied, the copy lives as long as the map.
struct WeightMap {
  CUtensorMap map;
  bool k_major;
  at::Tensor data;
  bool shared = true;
  int64_t ld = 0, entry_ld = 0;  // data's rows (or k lines), and its entries, elements apart
};

// The map of a K-contiguous weight w [N, K] with 16-byte aligned rows (and entries).
template <typename T>
WeightMap k_major_map(const skinny::Rows& w, int64_t entries = 1, int64_t entry_ld = 0) {
  const int64_t N = w.data.size(0), K = w.data.size(1);
  // A single row has no leading dimension; TMA still wants a valid pitch, which it never uses.
  return WeightMap{entries_map(static_cast<const T*>(w.data.data_ptr()), K, N,
                               N == 1 ? skinny::padded_pitch<T>(K) : w.ld, kRows, entries,
                               entry_ld),
                   true, w.data, entries <= 1, w.ld, entry_ld};
}

// The weights of a bmm batch b [B, K, N], or of a single product's b [K, N] (a weight all the
// entries share), as one map: row-major entries in place where TMA can address them, else
// K-contiguous ones in place or copied so (as skinny::batch_weights gives them); none where those
// rows or entries do not start 16-byte aligned. Entries 0 elements apart (one weight expanded)
// are one shared weight.
template <typename T>
std::optional<WeightMap> batch_weight_map(const at::Tensor& b) {
  const int64_t entries = b.dim() == 3 ? b.size(0) : 1;
  const bool n_major = skinny::n_major_in_place<T>(b.dim() == 3 ? b.select(0, 0) : b);
  const auto [w, entry_ld] = skinny::batch_weights(b, n_major);
  const int64_t map_entries = entry_ld == 0 ? 1 : entries;
  const int64_t lines = w.data.size(0), line = w.data.size(1);  // [N, K], or [K, N] n_major
  const bool overlap = map_entries > 1 && entry_ld < (lines - 1) * w.ld + line;
  if (overlap ||
      !skinny::rows_aligned<T>(w.data.data_ptr(), w.ld, skinny::Batch{entries, 0, entry_ld})) {
    return std::nullopt;
  }
  if (!n_major) return k_major_map<T>(w, map_entries, entry_ld);
  const int64_t K = lines, N = line;
  return WeightMap{entries_map(static_cast<const T*>(w.data.data_ptr()), N, K, w.ld,
                               kTmaBoxInnerOf<T>, map_entries, entry_ld),
                   false, w.data, map_entries == 1, w.ld, entry_ld};
}

// x's map: the tokens of a [B, M, K] (a single product's as a batch of one), in boxes of its M
// rows, not the tile's TOKENS (see the file's header). Rows or entries TMA cannot address are
// copied into padded ones (skinny::batch_tokens), as are entries that overlap (one expanded to
// all, 0 elements apart). `data` holds the memory the map points at.
struct TokensMap {
  CUtensorMap map;
  at::Tensor data;
  int64_t ld = 0, entry_ld = 0;  // data's rows, and its entries, elements apart
};

template <typename T>
TokensMap tokens_map(const at::Tensor& a) {
  const int64_t entries = a.size(0), M = a.size(1), K = a.size(2);
  std::pair<skinny::Rows, int64_t> x = skinny::batch_tokens<T>(a);
  if (entries > 1 && x.second < (M - 1) * x.first.ld + K) {
    x = skinny::batch_tokens<T>(a.contiguous());
  }
  const auto& [rows, entry_ld] = x;
  return {entries_map(static_cast<const T*>(rows.data.data_ptr()), K, M,
                      M == 1 ? skinny::padded_pitch<T>(K) : rows.ld, static_cast<int>(M), entries,
                      entry_ld),
          rows.data, rows.ld, entry_ld};
}

// Two blocks per SM overlap one block's start and end with the other's streaming; one block per
// SM with a deeper ring wins where the two-per-SM split leaves some SMs with two blocks and
// others with one (64 tokens on a 4096 x 4096 weight: 3 splits of 64 row blocks, 192 blocks on
// 132 SMs; alone, 2 splits put one block on each of 128 SMs, and the busiest SM streams a
// quarter less). Where the busiest SMs stream as much k either way, 16 bits take the deep ring
// alone if the other puts two blocks on them: on an H200 (CUDA graphs, weights rotated past L2,
// bf16 at 8-64 tokens) 6144 x 2048, 6144 x 4096 and 6144 x 8192 weights ran 1.07-1.17 times as
// fast so (96 blocks against 192 in two splits). float32's 3xTF32 multiplies keep an SM busier,
// and there two blocks per SM were the faster (6144 x 2048 at 8-32 tokens: 1.33-1.43 times the
// deep ring's speed), so float32 takes the deep ring only for less k.
// 128 float32 tokens fit their three stages in the deep ring only (two slots of x, 16 KB each, per
// 8 KB of weight): both rings are the deep one there.
template <typename T, int TOKENS>
constexpr int kSharedRingKb = std::is_same_v<T, float> && TOKENS > 64 ? kShape[2] : kShape[1];

// A bmm batch of short K-contiguous rows in 16 bits (attention's keys in q @ k^T, heads of
// 64-256 elements): in the rings above a block streams its 64 rows in one or two stages and
// spends most of its life starting, waiting for its first boxes and storing its sums, and only
// two blocks share an SM to overlap those. A ring of two one-box stages (18-48 KB, 32 KB at 64
// tokens) lets four to eight share one (registers allow as many). On an H200 (CUDA graphs,
// entries rotated past L2) fp16 q @ k^T ran 1.08-1.29 times as fast with it, bf16 likewise:
// 32 x [4096, 128] keys at 0.79-0.98x of torch.bmm over 1-64 tokens (0.62-0.77x before),
// 32 x [1024, 128] at 0.85-1.15x (0.79-0.94x); 8 x [4096, 256] at 0.83-1.07x. Single products
// keep the rings above: those measured (up to 16384 rows) fill the SMs in one wave, with no
// waiting block to overlap, and 16384 x 128 at 24-64 tokens ran at 0.85-1.05x of torch.mm here,
// under the 1.08-1.11x measured on the deep rings at 24-32 tokens (another run). K this short
// never splits (kMinStepsPerSplit).
constexpr int64_t kShortRingMaxK = 256;
template <int TOKENS>
constexpr int kShortRingKb = 2 * (kRows + TOKENS) * kRowUnits * 2 / 1024;

// Whether a batch in the short-K ring starts early (a programmatic dependent launch, see the
// file's header; it never splits, so starts_early leaves it out): its blocks live a few
// microseconds, and the next call's first ones then take the places of the last. Back to back in
// a CUDA graph (H200, bf16, entries rotated past L2), starting early ran heads of 64 at 1-32
// tokens 1.06-1.30 times as fast (32 x [1024, 64] at 1.28-1.43x of torch.bmm, 32 x [4096, 64]
// and 8 x [16384, 64] at 0.95-1.21x) and longer heads at 17-32 tokens 1.01-1.04 times (32 x
// [1024, 128] at 1.09-1.10x, 32 x [4096, 128] at 0.98x, 8 x [4096, 256] at 1.06x; fp16 alike).
// Elsewhere it cost up to 19%: heads of 128 and 256 up to 16 tokens (but 32 x [4096, 128] at
// 1-8, up to 2% faster), every head at 33-64 tokens.
constexpr bool short_ring_starts_early(int tokens, int64_t K) {
  return tokens == 32 || (tokens < 32 && K <= 64);
}

// Whether a 16-bit single product runs as a loop over its row blocks: blocks of the deep ring,
// one per SM, each streaming every sms-th row block, its ring filling with the next one's boxes
// while it multiplies the last of this one. Where the row blocks pass both places of every SM
// but fill less than a third (2 * sms < blocks <= 3 * sms: 16960-25344 rows on 132 SMs), a grid
// of them leaves most SMs with one two-per-SM ring in flight, half the bytes, as its last blocks
// run. Back to back in a CUDA graph (H200, weights rotated past L2, 1-64 tokens) the loop ran
// 17408 x 4096 1.05-1.14 times as fast (0.96-1.02x of torch.mm), 18944 x 3584 1.03-1.07 (bf16
// and fp16), 20480 x 4096 1.02-1.04, 24576 x 3072 1.05-1.07, 25344 x 4096 1.06-1.08, and 20480 x
// 4096 stored row-major 1.01-1.07. Past a third it did not pay: 26624 x 4096 ran 3-6% slower at
// 8-64 tokens, 28672 x 4096 from 1.3% faster to 2.5% slower, 128256 x 4096 up to 2.5% slower.
template <typename T>
bool loops_over_row_blocks(const Plan& shared, const Plan& alone, int64_t entries, int sms) {
  const int64_t blocks = shared.grid.x;
  return sizeof(T) == 2 && entries == 1 && shared.grid.y == 1 && alone.grid.y == 1 &&
         2 * sms < blocks && blocks <= 3 * sms;
}

// The plan of a loop over row blocks (loops_over_row_blocks) in a block per SM: unsplit, and
// started early, as its blocks fill the SMs.
Plan plan_loop(Plan p, int sms) {
  p.grid.x = static_cast<unsigned>(sms);
  p.early = true;
  return p;
}

// The deep ring's plan against the two-per-SM ring's (see kSharedRingKb).
template <typename T>
bool alone_is_faster(const Plan& alone, const Plan& shared) {
  if (alone.busiest_k != shared.busiest_k) return alone.busiest_k < shared.busiest_k;
  return sizeof(T) == 2 && alone.busiest_blocks < shared.busiest_blocks;
}

// out [entries, >= M * N]: each entry's [M, N] product at the start of its row (a single
// product's [M, N] is one such row).
template <typename T, int TOKENS, bool kWKMajor>
void launch_rings(const CUtensorMap& w_map, const CUtensorMap& x_map, Entries layout,
                  at::Tensor& out, int64_t entries, int64_t M, int64_t N, int64_t K) {
  const int sms = device_info_for(out.device())->multiProcessorCount;
  layout.out = entries > 1 ? out.stride(0) : 0;
  T* to = static_cast<T*>(out.data_ptr());
  if constexpr (kWKMajor && !std::is_same_v<T, float>) {
    if (entries > 1 && K <= kShortRingMaxK) {
      using Short = Ring<T, TOKENS, kShortRingKb<TOKENS>>;
      Plan short_k = plan<T, Short, true>(N, K, entries, sms);
      short_k.early = short_k.early || short_ring_starts_early(TOKENS, K);
      return launch<T, Short, true>(short_k, w_map, x_map, to, layout, M, N, K);
    }
  }
  using Shared = Ring<T, TOKENS, kSharedRingKb<T, TOKENS>>;
  using Alone = Ring<T, TOKENS, kShape[2]>;
  const Plan shared = plan<T, Shared, kWKMajor>(N, K, entries, sms);
  const Plan alone = plan<T, Alone, kWKMajor>(N, K, entries, sms);
  if (loops_over_row_blocks<T>(shared, alone, entries, sms)) {
    return launch<T, Alone, kWKMajor>(plan_loop(alone, sms), w_map, x_map, to, layout, M, N, K);
  }
  if (alone_is_faster<T>(alone, shared)) {
    launch<T, Alone, kWKMajor>(alone, w_map, x_map, to, layout, M, N, K);
  } else {
    launch<T, Shared, kWKMajor>(shared, w_map, x_map, to, layout, M, N, K);
  }
}

// a [entries, M, K] against w into out (launch_rings' layout).
template <typename T>
void launch_skinny_tma(const at::Tensor& a, const WeightMap& w, at::Tensor& out, int64_t N) {
  const int64_t entries = a.size(0), M = a.size(1), K = a.size(2);
  const TokensMap x = tokens_map<T>(a);
  const Entries layout{0, w.shared, x.data.data_ptr(), x.ld, x.entry_ld,
                       w.data.data_ptr(), w.ld, w.entry_ld};
  const auto with_tokens = [&](auto tokens) {
    constexpr int TOKENS = decltype(tokens)::value;
    if (w.k_major) {
      launch_rings<T, TOKENS, true>(w.map, x.map, layout, out, entries, M, N, K);
    } else {
      launch_rings<T, TOKENS, false>(w.map, x.map, layout, out, entries, M, N, K);
    }
  };
  if (M <= 8) {
    with_tokens(std::integral_constant<int, 8>{});
  } else if (M <= 16) {
    with_tokens(std::integral_constant<int, 16>{});
  } else if (M <= 32) {
    with_tokens(std::integral_constant<int, 32>{});
  } else if (M <= 64) {
    with_tokens(std::integral_constant<int, 64>{});
  } else {
    with_tokens(std::integral_constant<int, 128>{});
  }
}

// f(T{}) for the dtype this rung takes.
template <typename F>
void dispatch_dtype(at::ScalarType dtype, F&& f) {
  if (dtype == at::kFloat) {
    f(float{});
  } else {
    dispatch_16bit(dtype, f);
  }
}

void skinny_tma(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) {
  dispatch_dtype(a.scalar_type(), [&](auto dtype) {
    using T = decltype(dtype);
    skinny::check_extents(a, b, "skinny_tma");
    std::optional<WeightMap> w = batch_weight_map<T>(b);
    if (!w) {
      // Rows TMA cannot address: rung 10 reads them in place, up to its 64 rows; past those,
      // this rung copies them into aligned ones.
      if (a.size(0) <= skinny::kMaxM) return find_algorithm(a.device(), "skinny").run(a, b, out);
      w = k_major_map<T>(skinny::padded_copy<T>(b.t()));
    }
    launch_skinny_tma<T>(a.unsqueeze(0), *w, out, b.size(1));
  });
}

// A whole bmm batch (run_batched; registry.h gives the layout of out) in one launch: the entries
// are the grid's third dimension and the third of x's and w's maps. A launch per entry (the
// single product's) cost 5-7 us of the host's time each, more than such an entry's product takes
// at decode. Weights whose rows or entries TMA cannot address go to rung 10's batched kernel up
// to its 64 rows, and past them entry by entry to the single product, which copies them.
void skinny_tma_batched(const at::Tensor& a_in, const at::Tensor& b_in, at::Tensor& out_in) {
  skinny::in_grid_sized_parts(a_in, b_in, out_in, "skinny_tma", [](const at::Tensor& a,
                                                                   const at::Tensor& b,
                                                                   at::Tensor& out) {
    dispatch_dtype(a.scalar_type(), [&](auto dtype) {
      using T = decltype(dtype);
      const int64_t M = a.size(1), N = b.size(-1);
      if (const std::optional<WeightMap> w = batch_weight_map<T>(b)) {
        return launch_skinny_tma<T>(a, *w, out, N);
      }
      if (M <= skinny::kMaxM) return find_algorithm(a.device(), "skinny").run_batched(a, b, out);
      for (int64_t i = 0; i < a.size(0); ++i) {
        at::Tensor entry_out = out.select(0, i).narrow(0, 0, M * N).view({M, N});
        skinny_tma(a.select(0, i), b.dim() == 3 ? b.select(0, i) : b, entry_out);
      }
    });
  });
}

// Where rung 10 measured faster in 16 bits (scripts/bench_skinny.py): up to 8 tokens, and at 16
// as long as its 16-row blocks all fit on the GPU at once (two per SM), on weights under
// kLargeWeight (but for the narrower weights of rung10_is_faster below). On 4096 x 4096 an H100
// ran it level with this rung or up to 6% ahead with L2 cleared before each call, and 3-5% ahead
// back to back in a CUDA graph; an H200 ran the two level with L2 cleared and this rung 5-12%
// ahead back to back; all at 1.00-1.26x of torch.mm.
// From 32 tokens on, rung 10's blocks re-read x from L2 and this rung is up to four times faster
// (but not on rows of at most 128 elements, rung10_is_faster below).
// Weights of kLargeWeight bytes and more (14336 x 4096 in 16 bits) stay here at every token
// count: back to back, as serving engines run decode, rung 10 trailed torch.mm on them (down to
// 0.94x at 1-8 tokens, 0.84-0.97x at 16) while this rung runs at 1.01-1.09x, and 1.08-1.14x with
// L2 cleared.
// float32 (3xTF32 in both rungs) measured otherwise, with both timings on an H100 and an H200:
// rung 10 ahead by 2-28% up to 8 tokens on every weight, and at 16 tokens on 4096 x 4096 by up
// to 17% (or tied); at 16 on the larger weights this rung runs from 6% behind to 17% ahead, and
// from 24 tokens on it leads, up to 1.9x as fast as rung 10 at 64 tokens.
constexpr int64_t kLargeWeight = int64_t(64) << 20;

// Small weights go to rung 10 at every token count: back to back in a CUDA graph (weights rotated
// past L2, H100), at 64 tokens it took 1.9 against 2.9 us on 64 x 64 and 2.4 against 3.5 on
// 256 x 256 in bf16, and in float32 2.7 against 3.9 us on 64 x 64, 5.0 against 5.3 on 256 x 256
// and 5.3 against 6.8 on 512 x 512; from 512 x 512 in bf16 (5.0 against 4.1 us) and 1024 x 1024
// in float32 (10.6 against 9.1) this rung is the faster. Since rung 10 keeps its K splits to one
// wave, float32 weights of up to 1024 rows and 1024 x 4096 elements go to it as well: at 24-64
// tokens it took 5.8-8.1 against 7.4-9.1 us on 1024 x 1024 and 11.7-18.4 against 14.5-18.8 on
// 1024 x 4096, where on 2048 x 2048 this rung stays ahead (11.4-14.6 against 12.2-18.6).
bool small_weight(const at::Tensor& a, int64_t N, int64_t K) {
  if (a.scalar_type() != at::kFloat) return N * K <= 256 * 256;
  return N * K <= 512 * 512 || (N <= 1024 && N * K <= 1024 * 4096);
}

// Whether this rung's 64-row blocks, split K as far as it goes, are more than half as many as
// the SMs (more than 528 rows on 132 SMs).
bool reaches_half_the_sms(int64_t N, int sms) {
  return 2 * ceil_div(N, int64_t{kRows}) * kMaxSplits > sms;
}

// Whether this rung's 64-row blocks, unsplit, fill one place on every SM, or all but an eighth.
bool one_block_per_sm(int64_t N, int sms) {
  const int64_t blocks = ceil_div(N, int64_t{kRows});
  return blocks <= sms && fills_the_sms_evenly(blocks, sms);
}

bool rung10_is_faster(const at::Tensor& a, const at::Tensor& b) {
  const int64_t M = a.size(0), K = a.size(1), N = b.size(1);
  // A row-major weight TMA can address this rung reads in place (rung 10 copies float32 ones).
  if (skinny::tma_reads_n_major(a, b)) return false;
  if (small_weight(a, N, K)) return true;
  if (a.scalar_type() == at::kFloat) return M <= 8 || (M <= 16 && N * K <= int64_t(4096) * 4096);
  const int sms = device_info_for(a.device())->multiProcessorCount;
  // Short K-contiguous rows at 9-64 tokens: rung 10's short_rows_kernel (skinny.cuh), where
  // chunks x tiles are at most 8, or at 16 on rows of at most 64 elements: on an H200 this rung
  // ran 16384 x 128 at 24-32 tokens at 1.08-1.11x of torch.mm (short rows 1.06-1.09x) and
  // 16384 x 256 at 16 at 1.05-1.06x (1.01-1.02x), but 14336 x 64 at 48-64 at 0.85-0.88x (short
  // rows 1.03-1.05x). In passes (past 16 fragments: 33-64 tokens) on rows of 128 this rung is
  // the faster since it stores its sums through shared memory (store_sums): on 4608-10240 rows at
  // 40-64 tokens (H200) at 1.05-1.14x of torch.mm against 0.96-1.08x, level at 4608.
  if (M > 8 && !skinny::row_major(b) && skinny::short_rows_fit(M, K, N, sms)) {
    const int64_t fragments = skinny::short_rows_fragments(M, K);
    if (fragments <= 8 || K <= 64) return true;
  }
  if (N * K * static_cast<int64_t>(a.element_size()) >= kLargeWeight) return false;
  // Where rung 10's 16-row blocks fit on the GPU at once (two per SM), on K-contiguous rows of
  // at most 128 elements. On an H200 (1024-4096 rows of K 32, 64 and 128 at 17-64 tokens: 99
  // cases, bf16 and fp16) rung 10 ran at 0.91-1.39x of torch.mm there, ahead of this rung's
  // 0.72-1.10x in every case; at 6144 rows this rung led (0.69-1.11x against 0.62-0.88x) or tied.
  const bool one_wave = skinny::rung10_blocks_fit_at_once(N, sms);
  if (one_wave && K <= 128 && !skinny::row_major(b)) return true;
  // Up to 8 tokens rung 10 keeps the weights its blocks cover without a K split, and up to 16
  // those its blocks fit at once, but not where this rung's blocks reach more than half the SMs
  // and rung 10 splits K or runs 9-16 tokens. On an H200 (CUDA graphs, weights rotated past L2,
  // bf16 and fp16, each ring's launch planned by busiest_sm_blocks), at 4-16 tokens on 1024 x
  // 1024 to 2048 x 8192 weights (rung 10 splitting K) this rung ran at 1.16-2.40x of torch.mm
  // against 0.94-2.54x, ahead in 38 of 42 cases by up to 32% (behind by 4-6% on 1024 x 1024 up
  // to 8 tokens, 2-3% on 2048 x 1024 at 12-16); on 3072 x 3072 to 4096 x 14336 at 12-16 at
  // 1.08-1.26x against 0.99-1.26x. Where rung 10 splits no K, up to 8 tokens, the two were within
  // 6% of each other (4096 x 1024 to 8192 x 2048) but on 3072 x 3072 (rung 10 1.32-1.41x, this
  // rung 1.24-1.26x).
  if (reaches_half_the_sms(N, sms) && (M > 8 || skinny::rung10_splits_k(N, sms))) return false;
  // Nor up to 8 tokens where this rung's blocks take one place on every SM, or all but an eighth
  // of them (7361-8448 rows on 132 SMs), and its launch starts early (starts_early): on an H200
  // (same timing, bf16 and fp16, 1-8 tokens) on 7424-8448 rows of K 1024-4096 this rung ran at
  // 0.99-1.14x of torch.mm against rung 10's 0.88-1.09x, ahead by up to 12% (7424 x 4096,
  // 7680 x 4096) and behind by at most 1% (8192 x 1024 and 8448 x 2048 at 1-2 tokens).
  if (M <= 8 && one_block_per_sm(N, sms)) return false;
  return M <= 8 || (one_wave && M <= 16);
}

// Past 64 tokens `auto` takes this rung for float32 with TF32 off only: rung 9 then passes
// float32 to rung 8, whose 128-row tiles leave most SMs idle at these sizes (3xTF32 at
// 0.31-0.39x of torch.mm at 128 tokens on 4096 x 4096 and 4096 x 14336, both weight layouts,
// H100), while this rung still streams the weight once. 16-bit products and TF32 take rung 9
// (bf16 at 1.01-1.19x of torch.mm at 128 tokens on the three Llama weights, H100).
// A bmm batch (`entries` products in skinny_tma_batched's one launch; bmm's batch_algorithm asks
// up to 64 tokens) against rung 10's batched kernel. In CUDA graphs, entries rotated past L2,
// torch.bmm beside each case (H200), at 1-64 tokens:
// - 16-bit row-major entries [K, N] of K >= kMinRowMajorBatchK (p @ v): 32 x [1024, 128] at
//   0.91-1.20x of torch.bmm here against 0.62-1.07x, 32 x [4096, 128] 0.94-1.09x against
//   0.62-1.01x, 32 x [1024, 64] and [4096, 64] 0.89-1.31x against 0.71-1.16x, 32 x [2048, 128]
//   0.91-1.10x against 0.56-0.94x, 8 x [4096, 1024] 0.97-1.01x against 0.52-0.99x, 4 x
//   [4096, 4096] 0.94-0.97x against 0.44-0.88x. At K = 512: 32 x [512, 128] level up to 8 tokens
//   (1.13-1.14x against 1.15x) and ahead at 32-64 (0.84-0.96x against 0.75-0.94x), 16 x
//   [512, 1024] 0.96-0.98x against 0.38-0.87x, but 16 x [512, 256] 1.08-1.12x against 1.15-1.25x
//   at 1-12 tokens.
// - 16-bit K-contiguous entries w [N, K] of K >= kMinBatchK and N >= kMinBatchRows: 8 x
//   [1024 or 2048, 4096], 4 x [4096, 4096] and 16 x [256, 1024] at 0.91-1.23x here against
//   0.44-1.22x, 32 x [512, 2048] 0.94-1.07x against 0.48-1.00x (level up to 3 tokens). Fewer rows
//   stay on rung 10: 8 x [128, 4096] at 0.92-3.03x here against 0.93-3.25x, 16 x [64, 1024] up
//   to 16 tokens 1.34-2.03x against 1.36-2.19x (though 4 x [64, 4096] ran 1.65-2.39x here against
//   1.57-2.24x). Entries of kLargeEntryBytes or more past 8 tokens stay here whatever their
//   shape, as they ran entry by entry before this kernel: one launch each cost 5-7 us of the
//   host's time.
// - 16-bit K-contiguous entries of kShortRingMaxK < K < kMinBatchK, from kMinMidKBatchRows rows:
//   after busiest_sm_blocks, at 1-64 tokens 8 x [4096, 384], 8 x [4096, 512], 32 x [1024, 512]
//   and 8 x [2048, 768] ran at 0.87-1.02x here against 0.35-1.00x (two runs); 16 x [256, 512]
//   stays on rung 10 (1.11-1.33x against 1.04-1.15x up to 32 tokens).
// - 16-bit K-contiguous entries of kMinShortRingBatchK <= K <= kShortRingMaxK and N >=
//   kMinBatchRows (q @ k^T over heads of 64-256 elements), in the short-K ring, past
//   short_rows_lead_tokens(K): on heads of 64 past 16 tokens, of 128 past 8, of 256 at every
//   count. With sums stored through shared memory (store_sums), at 40-64 tokens 32 x [4096, 64]
//   ran at 0.88-0.92x of torch.bmm here against 0.68-0.70x on rung 10's short rows, 32 x
//   [1024, 64] 1.10-1.16x against 1.05-1.07x; at 10-64 tokens 32 x [4096, 128] 0.95-1.00x
//   against 0.64-0.93x, 32 x [1024, 128] 1.04-1.10x against 0.80-1.09x; 8 x [4096, 256]
//   1.00-1.04x against 0.40-1.01x at 8-64 tokens. Rung 10 led on heads of 128 at 8 tokens
//   (1.03x and 1.18x against 0.98x and 1.10x) and on heads of 64 up to 16, against this ring
//   started early (short_ring_starts_early): 32 x [4096, 64] and 8 x [16384, 64] at 1.03-1.47x
//   against 0.95-1.21x, though 32 x [1024, 64] ran 1.28-1.34x against 1.32-1.43x. At 17-32
//   tokens the early start leads by up to 13% (32 x [1024, 64] at 1.30-1.31x against
//   1.17-1.19x; 32 x [4096, 64] and 8 x [16384, 64] at 24-32 tokens 0.95-0.96x against
//   0.91-0.94x) and trails by at most 2% (those two at 17 tokens; fp16 alike).
// - float32 batches that rung 12 passes over: rung 10 copies row-major entries K-contiguous
//   (0.12-0.95x of torch.bmm on p @ v, against 2.0-8.3x here at 9-64 tokens), and on q @ k^T at
//   5-64 tokens ran at 0.50-1.15x where this rung ran 1.13-2.31x.
constexpr int64_t kMinRowMajorBatchK = 512;
constexpr int64_t kMinBatchK = 1024;
constexpr int64_t kMinBatchRows = 256;
constexpr int64_t kMinMidKBatchRows = 1024;
constexpr int64_t kLargeEntryBytes = int64_t(16) << 20;
constexpr int64_t kMinShortRingBatchK = 64;

// The token counts up to which rung 10's short rows stay ahead of the short-K ring on a batch of
// K-contiguous rows of K elements, kMinShortRingBatchK <= K <= kShortRingMaxK.
int64_t short_rows_lead_tokens(int64_t K) {
  if (K <= 64) return 16;
  return K <= 128 ? 8 : 0;
}

bool batch_goes_lower(const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() == at::kFloat) return false;
  const int64_t K = a.size(1), N = b.size(1);
  if (skinny::row_major(b)) return K < kMinRowMajorBatchK;
  if (K >= kMinBatchK && N >= kMinBatchRows) return false;
  if (K > kShortRingMaxK && N >= kMinMidKBatchRows) return false;
  if (K >= kMinShortRingBatchK && K <= kShortRingMaxK && N >= kMinBatchRows &&
      a.size(0) > short_rows_lead_tokens(K)) {
    return false;
  }
  const int64_t bytes = b.numel() * static_cast<int64_t>(b.element_size());
  return !(a.size(0) > 8 && bytes >= kLargeEntryBytes);
}

bool lower_rung_is_faster(const at::Tensor& a, const at::Tensor& b, int64_t entries) {
  // A row-major weight whose rows TMA cannot address (unaligned) this rung copies K-contiguous:
  // 16-bit ones go to rung 10, which reads them in place, and large float32 ones, which rung 10
  // copies too, on to rung 8.
  if (!skinny::tma_reads_n_major(a, b) && skinny::row_major(b) &&
      (a.scalar_type() != at::kFloat || skinny::rung8_is_faster_on_row_major(a, b))) {
    return true;
  }
  if (entries > 1) return batch_goes_lower(a, b);
  if (a.size(0) <= skinny::kMaxM) return rung10_is_faster(a, b);
  return a.scalar_type() != at::kFloat || at::globalContext().allowTF32CuBLAS();
}

MM_VARIANTS_REGISTER({"skinny_tma", c10::kCUDA, 11, {at::kFloat, at::kHalf, at::kBFloat16},
                      &skinny_tma, &sm90a, &skinny::tma_rows, skinny::kTmaRowsOnly,
                      /*auto_candidate=*/true, /*run_fused=*/nullptr, &skinny_tma_batched,
                      &lower_rung_is_faster});

}  // namespace
}  // namespace mm_variants::cuda
