// Rung 10, skinny: out = x @ w.t() for few rows of x (M <= 64, e.g. the tokens of LLM decode),
// with w an nn.Linear weight [N, K] read in place.
//
// At small M the product is memory bound: every weight element is used M times, so the time is
// the time to stream w once. The square-tile rungs stage 128-row tiles of A that are mostly
// padding, and give each block a large tile of C, so N / 256 blocks leave most SMs idle while the
// tensor cores multiply zeros. Here the roles are swapped and the tiles shrink to what M needs:
// - w is the 16-row operand A of mma.m16n8k16 (m16n8k8 for float32) and the tokens of x are the
//   8-column operand B, so no row is padding beyond M rounded up to 8. Each lane fetches its A
//   and B fragments straight from global memory as 16-byte vectors: the reduction order over k
//   is free, so lane (g, t) takes 8 consecutive k of w rows g and g + 8 and of token g, and
//   those words are exactly the fragment registers. No shared-memory staging, no ldmatrix.
// - A block owns 16 output columns (16 rows of w; 32 for some row-major weights, below); its
//   kWarps warps split K in interleaved steps. In a step a lane issues all its loads, weight and
//   x alike, before it uses any: one memory round trip per step, and each SM keeps tens of KB of
//   weight in flight. The loads are branch-free: rows past N and tokens past M read a valid row
//   instead, and only feed outputs that are never stored (a row-major weight's columns past N
//   read as zeros). w streams past L1 (no_allocate) with a 256-byte L2 prefetch; x, read
//   by every block, is cached. The warps' partial sums meet in shared memory and are added in a
//   fixed order. When N is too small to give every SM a block, blocks also split K and a second
//   pass adds their float partials in order: no atomics, bit-reproducible results.
// - float32 runs in 3xTF32 (x = big + small, products big*big + big*small + small*big), each
//   step's products summed afresh and added to the running sums by float32 adds: within
//   float32's tolerance at every K tested, and still far below the memory time.
// - A step's MMAs are ordered so that independent accumulator chains take turns; on sm_90a,
//   16-bit launches from 9 tokens start while the kernel before them finishes.
// - 16-bit K-contiguous rows of at most 256 elements at 1-8 tokens, and at up to 64 where there
//   are more than 32 rows per SM (attention's keys at decode; skinny::short_rows_fit), run in
//   short_rows_kernel instead: a warp owns whole rows and every k of them, so there is no K split
//   across warps and nothing meets in shared memory; its outputs, transposed in registers, leave
//   as whole 32-byte sectors.
// Other layouts: x that is not a row-major, 16-byte aligned matrix is first copied into one (it is
// small); w with another alignment is read element by element; a 16-bit weight stored row-major
// [K, N] (b itself, x @ w) is read in place, its fragments transposed in registers (`movmatrix`,
// see skinny_kernel), in blocks of 32 columns up to 32 tokens where its rows are 16-byte aligned
// (from 33 tokens on K >= 4096, of two 16-column warp groups where they are 8-byte aligned), its
// K left whole up to 1024; any other b that is not w.t()-shaped (K-contiguous), float32 row-major
// included, is copied into that layout first. A bmm batch of such products runs in one launch,
// its entries the grid's third dimension (skinny_batched).
#include "common.cuh"
#include "hopper.cuh"
#include "k_splits.cuh"
#include "launch.cuh"
#include "mma.cuh"
#include "skinny.cuh"

#include <ATen/ops/empty.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <utility>

namespace mm_variants::cuda {
namespace {

// The block shape: warps of a block, which split its K range in interleaved steps, and the
// 16-byte vectors (weight and x together) that a lane holds in flight in one step: the register
// budget of a step. MM_VARIANTS_SKINNY, predefined (e.g. by a pre-included header), overrides
// them for a sweep.
#ifndef MM_VARIANTS_SKINNY  // WARPS, VECTORS
#define MM_VARIANTS_SKINNY 8, 12
#endif
constexpr int kShape[] = {MM_VARIANTS_SKINNY};
constexpr int kWarps = kShape[0], kVectors = kShape[1];
constexpr int kThreads = 32 * kWarps;
constexpr int kRows = 16;  // output columns (rows of w) of a block
// Token tiles up to which a row-major weight with 16-byte aligned rows is read in blocks of 32
// columns (N_TILES = 2 in skinny_kernel). With 6 or 8 tiles the warps' sums would take over the
// 48 KB of static shared memory (and 8 spilled registers), so those keep 16 columns.
constexpr int kMaxWideTiles = 4;
// A row-major weight's K up to which K is not split: a split in two of such a K costs its adding
// pass more than it gains. On an H200 (CUDA graphs, weights rotated past L2, bf16; batches of 32
// entries of [1024, 64] and [1024, 128] values at 1-64 tokens, single [1024, 1024] and
// [1024, 2048] weights at 1, 16, 48 and 64) unsplit ran at 0.62-1.13x of torch.bmm / torch.mm,
// split in two at 0.61-1.08x: ahead in 22 of 26 cases, level in 3, 6% behind in one ([1024, 64]
// at 24 tokens, where 64 blocks leave half the SMs idle). Longer K keeps its splits: where the
// blocks are few, 4 or 8 splits of 512 k ran 1.01-1.36 times as fast as 2 or 4 of 1024 (K of
// 2048 and 4096).
constexpr int64_t kMaxUnsplitRowMajorK = 1024;
// Row-major weights of at least this K at 33-64 tokens (16-column blocks) take two warps side by
// side along N in a block (COLUMN_WARPS in skinny_kernel). Shorter K lost with them (0.54-0.57x
// of torch.bmm against 0.62-0.74x on 32 x [1024, 128] at 40-64 tokens): half the blocks, with K
// too short to split again, fill half the SMs' warp slots.
constexpr int64_t kMinColumnWarpsK = 4096;

// The k extent of a step for dtype T, TILES groups of 8 tokens and N_TILES groups of 16 output
// columns. A chunk is the k covered by one 16-byte vector on each of the four lanes of a fragment
// row; per chunk a lane loads two weight vectors per column group (rows g and g + 8, or their
// bytes in a row-major weight) and one x vector per token tile, so more tokens leave room for
// fewer chunks.
template <typename T, int TILES, int N_TILES = 1>
struct StepShape {
  static constexpr int kVec = 16 / sizeof(T);
  static constexpr int kChunk = 4 * kVec;
  static constexpr int kChunks = std::max(1, kVectors / (2 * N_TILES + TILES));
  static constexpr int kStep = kChunks * kChunk;
};

// The tensor-core product of one k slice for dtype T, on fragments given as raw 32-bit words.
// A 16-bit word holds two elements; a float32 word is split into kTerms tf32 parts.
template <typename T>
struct SkinnyMma;

template <>
struct SkinnyMma<c10::Half> {
  static constexpr int kTerms = 1;
  __device__ static void split(uint32_t x, uint32_t (&parts)[1]) { parts[0] = x; }
  __device__ static void run(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
    mma::mma_m16n8k16_f16(d, a, b);
  }
  __device__ static uint32_t pair(float x, float y) { return mma::pack_half2(x, y); }
};

template <>
struct SkinnyMma<c10::BFloat16> {
  static constexpr int kTerms = 1;
  __device__ static void split(uint32_t x, uint32_t (&parts)[1]) { parts[0] = x; }
  __device__ static void run(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
    mma::mma_m16n8k16_bf16(d, a, b);
  }
  __device__ static uint32_t pair(float x, float y) { return mma::pack_bfloat162(x, y); }
};

template <>
struct SkinnyMma<float> {
  static constexpr int kTerms = 2;  // big and small: x = big + small to at least 21 bits
  // big is x rounded to tf32, small the exact rest (|small| <= 2^-11 |x|). small goes to the MMA
  // as it is: whatever the tensor core does with bits past tf32's (dropping them, as it does on
  // Hopper), it errs by at most 2^-10 of small, 2^-21 of x, within float32's tolerance. Rounding
  // small too cost one conversion (issued at half rate) per word, and the kernel is issue bound
  // at many tokens: 1-5% faster without it at 32-64 tokens (H100), with the same errors.
  __device__ static void split(uint32_t x, uint32_t (&parts)[2]) {
    const mma::Tf32Parts split = mma::split_tf32(x);
    parts[0] = split.big;
    parts[1] = split.small;
  }
  __device__ static void run(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
    mma::mma_m16n8k8_tf32(d, a, b);
  }
};

using skinny::load_elements;
using skinny::load_row;
using skinny::load_streaming;
using skinny::word;

// Elements are moved as raw bits; only the MMA knows the dtype.
template <typename T>
using Bits = std::conditional_t<sizeof(T) == 2, uint16_t, uint32_t>;

// The 8-byte counterpart of load_streaming, for a row-major weight's quads (below).
__device__ __forceinline__ uint2 load_streaming_8(const void* p) {
  uint2 v;
  asm("ld.global.nc.L1::no_allocate.L2::256B.v2.u32 {%0, %1}, [%2];\n"
      : "=r"(v.x), "=r"(v.y)
      : "l"(p));
  return v;
}

// The 8- or 16-byte streaming load of a row-major weight's columns.
__device__ __forceinline__ void load_columns(const void* p, uint2& q) { q = load_streaming_8(p); }
__device__ __forceinline__ void load_columns(const void* p, uint4& q) { q = load_streaming(p); }

// The 8 x 8 matrix of 16-bit elements whose row r lane 4 r + c holds (elements 2 c and 2 c + 1),
// transposed: lane 4 r + c then holds elements 2 c and 2 c + 1 of its column r.
__device__ __forceinline__ uint32_t transposed(uint32_t x) {
  uint32_t d;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(d) : "r"(x));
  return d;
}

// A row-major weight's columns come to the A operand permuted (see skinny_kernel), where a lane
// loads COLUMNS consecutive ones (4 or 8): weight column n0 + c is A row a_row_of_column(c) of
// column group (c % COLUMNS) / 4, where A row r holds column COLUMNS (r % 8 / 2) + 2 (r / 8) +
// r % 2 (+ 4 in the second group).
template <int COLUMNS>
__device__ __forceinline__ int a_row_of_column(int c) {
  return 2 * (c / COLUMNS) + 8 * ((c >> 1) & 1) + (c & 1);
}

// Block (blockIdx.x, blockIdx.y) computes out[:, C bx : C bx + C] (C = 16 N_TILES columns) over
// its K range; TILES groups of 8 tokens cover M. W_VECTOR: w's pointer and leading dimension are
// 16-byte aligned (8-byte for N_MAJOR).
// N_MAJOR (16 bits): w is stored row-major [K, N] (x @ w for a weight kept [in, out]) and read in
// place. A fragment register holds two consecutive k of one weight column, where such a weight's
// rows run along n: lane (g, t) loads 8 bytes, columns n0 + 4 t .. n0 + 4 t + 3 of a weight row
// chosen by g, and `movmatrix` transposes each 8 x 8 matrix that a register of the warp's loads
// forms, handing lane (g, t) two k of one column. The loads of a warp are whole 32-byte sectors (8
// rows of 16 columns) where the rows are 32-byte aligned. A rows then hold the block's 16 columns
// permuted, which the epilogue undoes as it reads them back (a_row_of_column); the rows a load
// takes are chosen so that a lane's k are those of its x vector, as in the K-contiguous layout.
// N_TILES = 2 (N_MAJOR, rows 16-byte aligned): the block owns 32 columns and a lane loads 16
// bytes, 8 columns, of each row; words 0-1 of its loads feed the MMAs of columns 8 i .. 8 i + 3,
// words 2-3 those of 8 i + 4 .. 8 i + 7 (i = 0..3). A warp's load then takes two sectors of each
// row (rows 32-byte aligned) where 16 columns took one, in one L2 request (per 128-byte line) as
// before, and each x vector serves twice the columns.
// BATCHED: entry blockIdx.z of a batch (a kernel of its own, so that a single product's kernels
// keep their registers).
// COLUMN_WARPS: the block's warps stand that many side by side along N, each owning C columns,
// and the warps of one column group split K as all of them do otherwise. At 33-64 tokens a
// 16-column block re-reads all of x, whose bytes (64 tokens x K) are half those of a 128-column
// weight's; with two column groups a block's warps of one k step read the same x vectors (the
// second may find them in L1), and half as many blocks read x. On an H200 (CUDA graphs, weights
// rotated past L2, bf16; row-major weights of K 4096 and 8192 at 40-64 tokens: batches of 32 x
// [4096, 128] and [4096, 64] values, 8 x [8192, 128], 8 x [4096, 1024], single [4096, 4096] and
// [4096, 1024]) two column groups ran at 0.49-1.02x of torch.bmm / torch.mm against 0.44-1.04x,
// 1.01-1.26 times as fast in 9 of 13 cases and within 2% behind in the rest.
template <typename T, int TILES, bool W_VECTOR, bool N_MAJOR = false, int N_TILES = 1,
          bool BATCHED = false, int COLUMN_WARPS = 1>
__global__ void __launch_bounds__(kThreads, 512 / kThreads) skinny_kernel(skinny::Problem<T> p) {
  static_assert(!N_MAJOR || sizeof(T) == 2, "movmatrix moves 16-bit elements");
  static_assert(kWarps % COLUMN_WARPS == 0, "the warps of a column group split K alike");
  static_assert(N_TILES == 1 || N_MAJOR, "a K-contiguous block owns 16 columns");
  if constexpr (BATCHED) p = skinny::entry_of_batch(p);
  using E = Bits<T>;
  using Op = SkinnyMma<T>;
  using Shape = StepShape<T, TILES, N_TILES>;
  constexpr int kVec = Shape::kVec, kChunk = Shape::kChunk, kChunks = Shape::kChunks;
  constexpr int kStep = Shape::kStep;
  constexpr int kTerms = Op::kTerms;
  constexpr int kColumns = N_TILES * kRows;  // output columns of the block
  constexpr int kPitch = kColumns + 4;       // conflict-free stores of the accumulators below
  // N_MAJOR: a lane's loads of a weight row, 4 or 8 columns.
  using Quad = std::conditional_t<N_TILES == 2, uint4, uint2>;
  constexpr int kQuadColumns = sizeof(Quad) / sizeof(E);

  constexpr int kKWarps = kWarps / COLUMN_WARPS;  // warps that split K for one column group
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int g = lane / 4, t = lane % 4;
  const int column_warp = warp % COLUMN_WARPS, k_warp = warp / COLUMN_WARPS;
  const int block_n0 = blockIdx.x * kColumns * COLUMN_WARPS;
  const int n0 = block_n0 + column_warp * kColumns;
  const int k_begin = static_cast<int>(blockIdx.y * p.k_per_block);  // below K, an int
  const int k_end = static_cast<int>(min(static_cast<int64_t>(p.K), k_begin + p.k_per_block));

  // This lane reads w rows n0 + g and n0 + g + 8, and token 8 j + g of each tile j. A row past N
  // (a token past M) reads the last one instead: row r of the A operand (column c of B) only
  // reaches row r (column c) of the product, outputs that are never stored, so the loads need
  // no predicate.
  const E* w_row[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int n = min(n0 + g + 8 * h, p.N - 1);
    w_row[h] = reinterpret_cast<const E*>(p.w) + n * p.ldw + t * kVec;
  }
  // N_MAJOR: this lane's kQuadColumns columns of every weight row, of which n_left lie inside
  // (none past N: those read as zeros).
  const E* w_cols = reinterpret_cast<const E*>(p.w) + min(n0 + kQuadColumns * t, p.N - 1);
  const int n_left = p.N - (n0 + kQuadColumns * t);
  const bool quads_whole = W_VECTOR && n_left >= kQuadColumns;
  const E* x_row[TILES];
#pragma unroll
  for (int j = 0; j < TILES; ++j) {
    const int m = min(8 * j + g, p.M - 1);
    x_row[j] = reinterpret_cast<const E*>(p.x) + m * p.ldx + t * kVec;
  }

  float acc[N_TILES][TILES][4] = {};
  // float32: a tensor core adds into its accumulator without rounding to nearest, and that error
  // grows with the chain of MMAs into one register (a relative 1.3e-5 over K = 14336, above
  // float32's tolerance of 1e-5). So each step's MMAs start from zero in `fresh`, and the steps'
  // sums meet in acc through float32 adds: chains of one step. A group's fresh sums (below) go
  // into acc right after its last MMA of the step: where a step is one chunk (float32 from 33
  // tokens) only that group's are then live, not every tile's. With all of them live at 64
  // tokens, ptxas ran out of registers and recomputed every x address in every step.
  constexpr bool kFreshSums = std::is_same_v<T, float>;
  // The MMAs into one accumulator form a chain, each waiting for the one before it, and a warp
  // issues in order: written tile after tile, a float32 step at 64 tokens was one chain of 48
  // MMAs (the tiles' fresh sums shared registers), a single MMA in flight per warp. So the tiles
  // of a group take turns, MMA by MMA, and float32's lone tile (1-8 tokens) sums its two k slices
  // apart. float32 groups at most 6 tiles: with all 8, their fresh sums all live (124 registers),
  // 57-64 tokens ran up to 6% slower than in groups of 4. Beside the kernel before (H100, three
  // A/B runs, both timings): float32 1.04-1.29 times as fast at 32-48 tokens, 1.01-1.25 at 57-64
  // and 1.00-1.05 at 1-8; 16-bit inputs 2-11% faster from 32 tokens, within 2% below.
  constexpr int kGroup = kFreshSums && TILES > 6 ? 4 : TILES;
  static_assert(TILES % kGroup == 0, "groups of tiles cover the token tiles exactly");
  constexpr int kSliceChains = kFreshSums && TILES == 1 ? 2 : 1;
  // A step's loads must all be in flight before its first MMA, or a warp waits on memory more
  // than once a step. Short of registers, ptxas sinks loads it may move towards their first use:
  // from 8 MMAs per chunk (16-bit inputs from 32 tokens, float32 from 16) it issued the weight and
  // the first token tile's x, then each further tile's x just before that tile's MMAs. Loads
  // inside a branch stay in it, so there every step checks whether it is whole and loads in one
  // of two branches. A copy of this loop timed both ways on an H100 (scripts/bench_skinny.py's
  // weights, L2 cleared and back to back) ran 1.3-2.8 times as fast so at 32-64 tokens, and
  // float32 at 16 tokens 1.07-1.12 times (docs/performance/decode.md). With fewer MMAs ptxas
  // keeps the loads together anyway, and whole steps load without the check, which there was up
  // to 8% faster. The exception is three 16-bit token tiles (6 MMAs per chunk): there ptxas moved
  // the third tile's x loads behind the `8 j >= M` test each tile then had, a second round trip.
  constexpr int kMmasPerChunk = 2 * N_TILES * TILES * kTerms * (kTerms + 1) / 2;
  constexpr bool kKeepLoadsTogether = kMmasPerChunk >= 8 || TILES >= 3;

  // One step: k0 .. k0 + kStep; WHOLE when it is known to lie before k_end, else checked here.
  // Past k_end both operands read as zeros (load_row, load_quads), so the products there vanish.
  // k0 is an int for whole steps, 64-bit for checked ones, whose chunks may reach past 2^31 when
  // K is near it.
  const auto step = [&](auto k0, auto whole) {
    float fresh[TILES][kSliceChains][4] = {};  // float32 only, see kFreshSums
    [[maybe_unused]] uint4 wv[kChunks][2];  // K-contiguous: rows g and g + 8
    [[maybe_unused]] Quad wq[kChunks][4];  // N_MAJOR: slice s's quads, words 2 s + h (h = 0, 1)
    uint4 xv[kChunks][TILES];
    // N_MAJOR: the weight row of quad (s, h): row g of the 8 x 8 matrices that movmatrix
    // transposes is k 8 (g / 2) + 4 s + 2 h + g % 2 of the chunk, so that lane t receives k
    // 8 t + 4 s + 2 h and the next, words 2 s + h of its x vector.
    const auto load_quads = [&](auto in_bounds, auto vector) {
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const auto k = k0 + c * kChunk + 8 * (g / 2) + 2 * q + g % 2;
          const bool row_inside = decltype(in_bounds)::value || k < k_end;
          if constexpr (decltype(vector)::value) {  // all columns inside, aligned
            if (row_inside) {
              load_columns(w_cols + k * p.ldw, wq[c][q]);
            } else {
              wq[c][q] = Quad{};
            }
          } else {
            wq[c][q] = load_elements<Quad>(w_cols + k * p.ldw, row_inside ? n_left : 0);
          }
        }
      }
    };
    const auto load = [&](auto in_bounds) {
      if constexpr (N_MAJOR) {
        if (quads_whole) {
          load_quads(in_bounds, std::true_type{});
        } else {
          load_quads(in_bounds, std::false_type{});
        }
      }
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        const auto k = k0 + c * kChunk;
        const int left =
            decltype(in_bounds)::value ? kVec : static_cast<int>(k_end - k - t * kVec);
        if constexpr (!N_MAJOR) {
#pragma unroll
          for (int h = 0; h < 2; ++h) wv[c][h] = load_row<W_VECTOR, true>(w_row[h] + k, left);
        }
#pragma unroll
        for (int j = 0; j < TILES; ++j) xv[c][j] = load_row<true, false>(x_row[j] + k, left);
      }
    };
    if constexpr (decltype(whole)::value) {
      load(std::true_type{});
    } else if (k0 + kStep <= k_end) {
      load(std::true_type{});
    } else {
      load(std::false_type{});
    }
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      // Two MMA k slices per chunk: slice s takes words 2s and 2s + 1 of each vector.
      uint32_t a[N_TILES][2][kTerms][4];
#pragma unroll
      for (int nt = 0; nt < N_TILES; ++nt) {
#pragma unroll
        for (int s = 0; s < 2; ++s) {
#pragma unroll
          for (int q = 0; q < 4; ++q) {  // a0: row g, a1: row g + 8, a2 / a3: their next word
            uint32_t parts[kTerms];
            if constexpr (N_MAJOR) {  // quad (s, q / 2), word 2 nt + q % 2: two columns
              parts[0] = transposed(word(wq[c][2 * s + q / 2], 2 * nt + q % 2));
            } else {
              Op::split(word(wv[c][q % 2], 2 * s + q / 2), parts);
            }
#pragma unroll
            for (int i = 0; i < kTerms; ++i) a[nt][s][i][q] = parts[i];
          }
        }
      }
#pragma unroll
      for (int j0 = 0; j0 < TILES; j0 += kGroup) {
        if (8 * j0 >= p.M) break;  // a group past M: warp-uniform
        // Only the group's first tile is checked: a later one past M reads valid rows (see
        // x_row) and feeds outputs that are never stored.
        uint32_t b[kGroup][2][kTerms][2];
#pragma unroll
        for (int jj = 0; jj < kGroup; ++jj) {
#pragma unroll
          for (int w = 0; w < 4; ++w) {  // b0: word 2s, b1: word 2s + 1 of slice s
            uint32_t parts[kTerms];
            Op::split(word(xv[c][j0 + jj], w), parts);
#pragma unroll
            for (int i = 0; i < kTerms; ++i) b[jj][w / 2][i][w % 2] = parts[i];
          }
        }
        // Small terms first; the product of the two small parts is below float32 rounding.
        // Innermost, the chains take turns: the group's tiles, a lone tile's two slices, and the
        // column groups.
#pragma unroll
        for (int so = 0; so < 2 / kSliceChains; ++so) {
#pragma unroll
          for (int ia = kTerms - 1; ia >= 0; --ia) {
#pragma unroll
            for (int ib = kTerms - 1 - ia; ib >= 0; --ib) {
#pragma unroll
              for (int jj = 0; jj < kGroup; ++jj) {
#pragma unroll
                for (int si = 0; si < kSliceChains; ++si) {
#pragma unroll
                  for (int nt = 0; nt < N_TILES; ++nt) {
                    float(&into)[4] = kFreshSums ? fresh[j0 + jj][si] : acc[nt][j0 + jj];
                    Op::run(into, a[nt][so + si][ia], b[jj][so + si][ib]);
                  }
                }
              }
            }
          }
        }
        if (kFreshSums && c == kChunks - 1) {
#pragma unroll
          for (int jj = 0; jj < kGroup; ++jj) {
#pragma unroll
            for (int si = 0; si < kSliceChains; ++si) {
#pragma unroll
              for (int q = 0; q < 4; ++q) acc[0][j0 + jj][q] += fresh[j0 + jj][si][q];
            }
          }
        }
      }
    }
  };

  // Launched early (see launch_skinny), the block may be running while the kernel before it,
  // which may be writing x, finishes: wait for it before the first load. Otherwise this returns
  // at once. Then the next kernel may start early in turn.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  hopper::wait_for_previous_grid();
  hopper::allow_next_grid();
#endif
  int64_t k0 = k_begin + k_warp * kStep;  // 64-bit: the last increment may pass 2^31
  if constexpr (kKeepLoadsTogether) {
    for (; k0 < k_end; k0 += kKWarps * kStep) step(k0, std::false_type{});
  } else {
    for (; k0 + kStep <= k_end; k0 += kKWarps * kStep) {
      step(static_cast<int>(k0), std::true_type{});
    }
    if (k0 < k_end) step(k0, std::false_type{});
  }

  // The warps' sums meet in shared memory as [token][row]; each thread then adds the kWarps
  // values of some outputs in warp order and stores them, consecutive threads along n.
  __shared__ float sums[kWarps][TILES * 8][kPitch];
#pragma unroll
  for (int nt = 0; nt < N_TILES; ++nt) {
#pragma unroll
    for (int j = 0; j < TILES; ++j) {
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        sums[warp][8 * j + 2 * t + q % 2][kRows * nt + g + 8 * (q / 2)] = acc[nt][j][q];
      }
    }
  }
  __syncthreads();
  constexpr int kBlockColumns = kColumns * COLUMN_WARPS;
  for (int e = threadIdx.x; e < TILES * 8 * kBlockColumns; e += kThreads) {
    const int m = e / kBlockColumns, n = block_n0 + e % kBlockColumns;
    const int group = e % kBlockColumns / kColumns, c = e % kColumns;
    if (m >= p.M || n >= p.N) continue;
    // The A operand's row, after those of the column groups before it.
    const int row = N_MAJOR ? kRows * (c % kQuadColumns / 4) + a_row_of_column<kQuadColumns>(c) : c;
    float sum = 0.0f;
#pragma unroll
    for (int w = 0; w < kKWarps; ++w) sum += sums[w * COLUMN_WARPS + group][m][row];
    if constexpr (std::is_same_v<T, float>) {
      if (isnan(sum)) {  // perhaps an infinite sum that 3xTF32 cannot give (mma::split_tf32)
        sum = mma::plain_dot(p.x + int64_t(m) * p.ldx + k_begin, 1,
                             p.w + int64_t(n) * p.ldw + k_begin, 1, k_end - k_begin);
      }
    }
    skinny::store_sum(p, m, n, sum);
  }
}

// 16-bit K-contiguous rows of at most 256 elements (q @ k^T at a head size of 64-256) at 1-8
// tokens, and at up to 64 in token tiles (skinny::short_rows_fit). skinny_kernel's block
// owns 16 rows and its warps split K in steps of up to 8 chunks, so on such rows one or two warps
// of 8 hold any k, the block still meets in shared memory, and a key cache is thousands of such
// blocks. Here a warp owns whole rows: kShortGroups groups of 16, every chunk of their K loaded at
// once (8 or 16 weight vectors a lane), its token tiles' x fragments loaded once; at one tile each
// group's two k slices sum in separate chains, which meet in a fixed order, and the sums go from
// the registers to out (in whole 32-byte sectors, store_group_tile): no shared memory, no K split.
// Blocks are small (kShortWarps warps), so that a single product of a few thousand rows still
// spreads over every SM. On an H200 (CUDA graphs, weights rotated past L2; 12 products and batches
// of 64-256 k at 1, 2, 4 and 8 tokens, bf16 and fp16: 96 cases) it ran at 1.00-1.48x of torch.mm /
// torch.bmm, where skinny_kernel ran at 0.21-1.38x and rung 12's short_k_kernel at 0.15-1.25x:
// never slower than either (within 1%), and up to 5.6 and 7.4 times as fast.
constexpr int kShortWarps = 4;
using skinny::kShortChunk;
using skinny::kShortMaxChunks;
// TILES token tiles of 8 in a pass (CHUNKS * TILES <= 16): a tile's x fragments of every chunk
// stay in registers, so tiles count as chunks towards the groups of 16 rows a warp owns.
template <int CHUNKS, int TILES = 1>
constexpr int kShortGroups = CHUNKS * TILES >= 4 ? 1 : 4 / (CHUNKS * TILES);

// One group's (16 rows) sums for one token tile (8 tokens), sum[q] as accumulator q holds them
// (row g + 8 (q / 2), token 2 t + q % 2), stored as whole 32-byte sectors: rows g and g + 8 as two
// 8 x 8 matrices of (row, token) transposed by movmatrix leave lane (g, t) token g's rows 2 t,
// 2 t + 1 and 8 + 2 t, 8 + 2 t + 1; one exchange with the neighbouring lane gives each lane 4
// consecutive rows of one token, an 8-byte store. Straight from the accumulators each lane stores
// 2 bytes 4 times, a warp's store 16-byte pieces of 4 tokens. Needs N a multiple of 4 and out
// 8-byte aligned; all lanes take part (movmatrix, the exchange), stores past M or N are dropped.
template <typename T>
__device__ __forceinline__ void store_group_tile(const skinny::Problem<T>& p, const float (&sum)[4],
                                                 int64_t row0, int token0, int g, int t) {
  const uint32_t low = transposed(SkinnyMma<T>::pair(sum[0], sum[1]));
  const uint32_t high = transposed(SkinnyMma<T>::pair(sum[2], sum[3]));
  const bool even = t % 2 == 0;
  const uint32_t other = __shfl_xor_sync(0xffffffffu, even ? high : low, 1);
  const int m = token0 + g;
  const int64_t n = row0 + (even ? 2 * t : 8 + 2 * (t - 1));
  if (m < p.M && n < p.N) {
    *reinterpret_cast<uint2*>(p.out + static_cast<int64_t>(m) * p.N + n) =
        even ? make_uint2(low, other) : make_uint2(other, high);
  }
}

// This lane's x vectors of token tiles token0 / 8 .. token0 / 8 + TILES - 1, every chunk. As in
// skinny_kernel, tokens past M read the last one, for outputs never stored; k past K reads as
// zeros (load_row).
template <int CHUNKS, int TILES, typename T>
__device__ __forceinline__ void load_token_tiles(const skinny::Problem<T>& p, int token0, int g,
                                                 int t, uint4 (&xv)[CHUNKS][TILES]) {
  using E = Bits<T>;
  constexpr int kVec = 8;
#pragma unroll
  for (int j = 0; j < TILES; ++j) {
    const E* x_row = reinterpret_cast<const E*>(p.x) + min(token0 + 8 * j + g, p.M - 1) * p.ldx +
                     t * kVec;
#pragma unroll
    for (int c = 0; c < CHUNKS; ++c) {
      xv[c][j] = load_row<true, false>(x_row + c * kShortChunk, p.K - (c * kShortChunk + t * kVec));
    }
  }
}

// PASSES: passes over the token tiles, TILES at a time, against the weight vectors loaded once,
// where all the tiles would hold more than 16 x vectors a lane; block row blockIdx.y takes passes
// blockIdx.y * PASSES onwards (launch_short_rows spreads the passes over blocks where the GPU is
// otherwise short of warps).
template <typename T, int CHUNKS, int TILES, bool BATCHED, int PASSES = 1, bool SPREAD = false>
__global__ void __launch_bounds__(32 * kShortWarps) short_rows_kernel(skinny::Problem<T> p) {
  static_assert(sizeof(T) == 2, "16-bit MMAs take a chunk's vector in two k slices");
  static_assert(CHUNKS * TILES <= skinny::kShortMaxFragments, "x fragments of <= 16 vectors");
  if constexpr (BATCHED) p = skinny::entry_of_batch(p);
  using E = Bits<T>;
  constexpr int kVec = 8, kChunk = kShortChunk, kGroups = kShortGroups<CHUNKS, TILES>;
  // One token tile: each group's two k slices in separate chains; more tiles are chains enough.
  constexpr int kSlices = TILES == 1 ? 2 : 1;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int g = lane / 4, t = lane % 4;
  const int64_t n0 = (static_cast<int64_t>(blockIdx.x) * kShortWarps + warp) * kGroups * kRows;
  // As in skinny_kernel: rows past N read the last one, for outputs never stored.
  uint4 xv[CHUNKS][TILES], wv[kGroups][2][CHUNKS];
  // Where no block row takes other passes (SPREAD off), the first token is a constant: read from
  // blockIdx.y, it took 134 registers instead of 100 in the batched kernel of 2 chunks in 8 tiles
  // (one block fewer an SM).
  const int first_pass = SPREAD ? static_cast<int>(blockIdx.y) * PASSES : 0;
  load_token_tiles(p, 8 * TILES * first_pass, g, t, xv);
#pragma unroll
  for (int r = 0; r < kGroups; ++r) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t n = std::min<int64_t>(n0 + r * kRows + g + 8 * h, p.N - 1);
      const E* w_row = reinterpret_cast<const E*>(p.w) + n * p.ldw + t * kVec;
#pragma unroll
      for (int c = 0; c < CHUNKS; ++c) {
        wv[r][h][c] = load_row<true, true>(w_row + c * kChunk, p.K - (c * kChunk + t * kVec));
      }
    }
  }
#pragma unroll
  for (int pass = 0; pass < PASSES; ++pass) {
    const int token0 = 8 * TILES * (first_pass + pass);
    if (pass > 0) {
      if (token0 >= p.M) return;
      load_token_tiles(p, token0, g, t, xv);
    }
    float acc[kGroups][TILES][kSlices][4] = {};
#pragma unroll
    for (int c = 0; c < CHUNKS; ++c) {
#pragma unroll
      for (int s = 0; s < 2; ++s) {
#pragma unroll
        for (int r = 0; r < kGroups; ++r) {
          const uint32_t a[4] = {word(wv[r][0][c], 2 * s), word(wv[r][1][c], 2 * s),
                                 word(wv[r][0][c], 2 * s + 1), word(wv[r][1][c], 2 * s + 1)};
#pragma unroll
          for (int j = 0; j < TILES; ++j) {  // independent chains take turns
            const uint32_t b[2] = {word(xv[c][j], 2 * s), word(xv[c][j], 2 * s + 1)};
            SkinnyMma<T>::run(acc[r][j][s % kSlices], a, b);
          }
        }
      }
    }
    // Whole sectors where out allows them. On an H200 (CUDA graphs, weights rotated past L2; 53
    // cases: products and batches of K 32-256 at 1-64 tokens, bf16 and fp16) they ran up to 1.98
    // times as fast as 2-byte stores where outputs are much of the traffic (32 x [4096, 32] at
    // 64 tokens: 16.7 -> 8.4 us; 16384 x 32 at 64: 3.94 -> 2.90; K = 64 at 32 tokens:
    // 1.10-1.28x), level to 1.07x at 1-8 tokens on K of 64-128; but at 8 chunks (K of 225-256)
    // up to 1.6% slower: there the output is a small part of the traffic, so those keep the
    // 2-byte stores.
    if (CHUNKS < kShortMaxChunks && p.partial == nullptr && p.N % 4 == 0 &&
        reinterpret_cast<uintptr_t>(p.out) % 8 == 0) {
#pragma unroll
      for (int r = 0; r < kGroups; ++r) {
#pragma unroll
        for (int j = 0; j < TILES; ++j) {
          float sum[4];
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            sum[q] = acc[r][j][0][q];
            if constexpr (kSlices == 2) sum[q] += acc[r][j][1][q];
          }
          store_group_tile(p, sum, n0 + r * kRows, token0 + 8 * j, g, t);
        }
      }
      if constexpr (PASSES == 1) return;  // the one pass's stores end the kernel
      continue;
    }
    // Accumulator q of a group and tile j: row g + 8 (q / 2), token token0 + 8 j + 2 t + q % 2.
#pragma unroll
    for (int r = 0; r < kGroups; ++r) {
#pragma unroll
      for (int j = 0; j < TILES; ++j) {
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const int m = token0 + 8 * j + 2 * t + q % 2;
          const int64_t n = n0 + r * kRows + g + 8 * (q / 2);
          if (m >= p.M || n >= p.N) continue;
          float sum = acc[r][j][0][q];
          if constexpr (kSlices == 2) sum += acc[r][j][1][q];
          skinny::store_sum(p, m, static_cast<int>(n), sum);
        }
      }
    }
  }
}

// Whether short_rows_kernel takes x [M, K] against w (skinny::short_rows_fit), the weight rows
// (every entry's) 16-byte aligned.
template <typename T>
bool short_rows_take(const at::Tensor& x, const at::Tensor& w, int64_t ldw,
                     const skinny::Batch& batch) {
  const int sms = device_info_for(x.device())->multiProcessorCount;
  return sizeof(T) == 2 &&
         skinny::short_rows_fit(x.size(0), x.size(1), w.size(0) * batch.entries, sms) &&
         skinny::rows_aligned<T>(w.data_ptr(), ldw, batch);
}

// f(std::integral_constant<int, P>): the passes P of ALL_PASSES (1, 2 or 4) that a block of
// short_rows_kernel takes, the rest spread over block rows. Spread as far as the blocks (`blocks`
// of one pass) still fit on the GPU at once (`resident()` blocks, asked only where passes could
// spread: a single pass, as at 1-8 tokens, needs no occupancy lookup): each block then loads its
// weight rows again, mostly from L2 where the blocks sharing them run together. A warp owns 16 rows
// past 16 fragments, so a few thousand rows are few warps to an SM, each taking its passes one
// after another. On an H200 (CUDA graphs, weights rotated past L2, bf16; 4500-10240 rows of 128 and
// 256 elements at 40-64 tokens, and 4 x [1536, 256] at 64) spread passes ran at 0.65-1.50x of
// torch.mm / torch.bmm, every pass in one block at 0.50-1.16x, skinny_kernel at 0.55-1.36x; spread
// within 2% of skinny_kernel or ahead in every case (decode.md, "Short rows in passes").
template <int ALL_PASSES, typename Resident, typename F>
void with_passes_per_block(int64_t blocks, Resident&& resident, F&& f) {
  if constexpr (ALL_PASSES >= 2) {
    const int64_t fit = resident();
    if (blocks * ALL_PASSES <= fit) return f(std::integral_constant<int, 1>{});
    if constexpr (ALL_PASSES == 4) {
      if (blocks * 2 <= fit) return f(std::integral_constant<int, 2>{});
    }
  }
  f(std::integral_constant<int, ALL_PASSES>{});
}

template <typename T>
void launch_short_rows(const at::Tensor& x, int64_t ldx, const at::Tensor& w, int64_t ldw,
                       at::Tensor& out, const skinny::Batch& batch) {
  const int64_t M = x.size(0), K = x.size(1);
  const skinny::SplitProduct<T> product({x, ldx}, {w, ldw}, out, KSplit{1, K}, batch);
  skinny::dispatch_power_of_two(ceil_div(K, int64_t{kShortChunk}), [&](auto chunks_c) {
    skinny::dispatch_power_of_two(ceil_div(M, int64_t{8}), [&](auto all_tiles_c) {
      constexpr int kChunks = decltype(chunks_c)::value;
      // Token tiles of a pass: as many as keep chunks x tiles within 16 (powers of two both).
      constexpr int kTiles =
          std::min(int{decltype(all_tiles_c)::value}, skinny::kShortMaxFragments / kChunks);
      constexpr int kAllPasses = decltype(all_tiles_c)::value / kTiles;
      const int64_t rows_per_block = int64_t{kShortWarps} * kShortGroups<kChunks, kTiles> * kRows;
      const int64_t blocks = ceil_div(out.size(1), rows_per_block);
      const int64_t passes = ceil_div(ceil_div(M, int64_t{8}), int64_t{kTiles});  // that reach M
      dispatch_bools(
          [&](auto batched_c) {
            constexpr bool kBatched = decltype(batched_c)::value;
            const auto resident = [&] {
              int64_t fit = 0;  // one pass: not asked, and no spread kernel built
              if constexpr (kAllPasses >= 2) {
                fit = resident_blocks_per_sm(
                          short_rows_kernel<T, kChunks, kTiles, kBatched, 1, true>,
                          32 * kShortWarps, 0) *
                      int64_t{device_info_for(x.device())->multiProcessorCount};
              }
              return fit;
            };
            with_passes_per_block<kAllPasses>(blocks * batch.entries, resident, [&](auto per_c) {
              constexpr int kPasses = decltype(per_c)::value;
              const KernelLaunch launch(
                  skinny::grid_of(blocks, static_cast<int>(ceil_div(passes, int64_t{kPasses})),
                                  batch),
                  32 * kShortWarps, 0);
              // Fewer passes than all: block rows take the rest (SPREAD).
              launch.run(short_rows_kernel<T, kChunks, kTiles, kBatched, kPasses,
                                           (kPasses < kAllPasses)>,
                         product.problem());
            });
          },
          batch.entries > 1);
    });
  });
}

// Launches the kernel for TILES token tiles on prepared operands (see skinny_typed), splitting
// K over blocks when N alone gives fewer blocks than SMs, and then the pass that adds the splits.
// A batch's entries (x, w and out then entry 0's) are the grid's third dimension; K is split
// where all their blocks together are fewer than SMs.
template <typename T, int TILES, bool N_MAJOR, int N_TILES = 1, int COLUMN_WARPS = 1>
void launch_skinny(const at::Tensor& x, int64_t ldx, const at::Tensor& w, int64_t ldw,
                   at::Tensor& out, const skinny::Batch& batch) {
  constexpr int kStep = StepShape<T, TILES, N_TILES>::kStep;
  const int64_t K = x.size(1), N = out.size(1);
  const int blocks = static_cast<int>(ceil_div(N, kRows * N_TILES * COLUMN_WARPS));
  const int64_t min_k = N_MAJOR && K <= kMaxUnsplitRowMajorK
                            ? std::max<int64_t>(K, 1)  // one split
                            : static_cast<int64_t>(kStep) * (kWarps / COLUMN_WARPS);
  const skinny::SplitProduct<T> product({x, ldx}, {w, ldw}, out,
                                        skinny::split_for(batch, blocks, K, kStep, min_k), batch);
  // 16-bit inputs from 9 tokens launch early (a programmatic dependent launch): the blocks start
  // while the kernel before them finishes and wait for it in the kernel. Launched back to back on
  // a stream, a stand-alone copy (H100, bf16, 16-64 tokens) ran 1.02-1.05 times as fast so on a
  // 4096 x 4096 weight, 1.09-1.17 on 4096 x 1024 and 1.00-1.02 on 14336 x 4096 and 4096 x 14336;
  // with L2 cleared before each call, the same within 1.5%. In CUDA graphs the package gained up
  // to 3% (16-32 tokens). At 1-8 tokens it was 4-11% slower on two of the four weights. Only
  // sm_90a code holds the wait (sm90a(); the sm_80 code runs elsewhere), so only it launches so.
  // Not where an SM holds three blocks (at most 80 registers a thread, allocated in steps of 8: the
  // row-major path in 16-column blocks at 9-24 tokens). There the next call's blocks take the free
  // third slots while this one runs, then the slots its SMs free as they finish, so they end up
  // three on some SMs and one on others, and the busiest SMs set the time: on an H100 in CUDA
  // graphs, 16 tokens on 4096 x 14336 took 75.0 us against 48.5 at one token. The 32-column
  // kernels (9-32 tokens) take 103-128 registers, two blocks an SM, and launch early.
  const auto run = [&](auto kernel) {
    KernelLaunch launch(skinny::grid_of(blocks, product.splits(), batch), kThreads, 0);
    launch.starting_early(sizeof(T) == 2 && TILES >= 2 && sm90a(x.device()) &&
                          resident_blocks_per_sm(kernel, kThreads, 0) <= 2);
    launch.run(kernel, product.problem());
  };
  const bool batched = batch.entries > 1;
  // Two tiles a lane or column groups: launch_for_tokens takes them where rows are aligned.
  if constexpr (N_TILES == 2 || COLUMN_WARPS > 1) {
    dispatch_bools([&](auto batched_c) {
      run(skinny_kernel<T, TILES, true, true, N_TILES, decltype(batched_c)::value, COLUMN_WARPS>);
    }, batched);
  } else {
    const bool w_vector = N_MAJOR ? skinny::rows_aligned<T, 8>(w.data_ptr(), ldw, batch)
                                  : skinny::rows_aligned<T>(w.data_ptr(), ldw, batch);
    dispatch_bools(
        [&](auto w_vector_c, auto batched_c) {
          run(skinny_kernel<T, TILES, decltype(w_vector_c)::value, N_MAJOR, 1,
                            decltype(batched_c)::value>);
        },
        w_vector, batched);
  }
  product.add_splits();
}

// Token tiles past M cost their x loads (they read a valid row) and registers, so M picks the
// fewest tiles that cover it: 3 instead of 4 tiles at 17-24 tokens ran up to 4% faster, 6 instead
// of 8 at 40-48 tokens 7-18% (float32) and up to 5% (16-bit), on an H100.
template <typename T, bool N_MAJOR>
void launch_for_tokens(const at::Tensor& x, int64_t ldx, const at::Tensor& w, int64_t ldw,
                       at::Tensor& out, const skinny::Batch& batch = {}) {
  if constexpr (sizeof(T) == 2 && !N_MAJOR) {
    if (short_rows_take<T>(x, w, ldw, batch)) {
      return launch_short_rows<T>(x, ldx, w, ldw, out, batch);
    }
  }
  const auto launch = [&](auto tiles_c) {
    constexpr int kTiles = decltype(tiles_c)::value;
    // A row-major weight whose rows take 16-byte loads: blocks of 32 columns (see skinny_kernel).
    if constexpr (N_MAJOR && kTiles <= kMaxWideTiles) {
      if (skinny::rows_aligned<T>(w.data_ptr(), ldw, batch)) {
        return launch_skinny<T, kTiles, true, 2>(x, ldx, w, ldw, out, batch);
      }
    }
    if constexpr (N_MAJOR && kTiles > kMaxWideTiles) {
      if (x.size(1) >= kMinColumnWarpsK && skinny::rows_aligned<T, 8>(w.data_ptr(), ldw, batch)) {
        return launch_skinny<T, kTiles, true, 1, 2>(x, ldx, w, ldw, out, batch);
      }
    }
    launch_skinny<T, kTiles, N_MAJOR>(x, ldx, w, ldw, out, batch);
  };
  const int64_t M = x.size(0);
  if (M <= 8) {
    launch(std::integral_constant<int, 1>{});
  } else if (M <= 16) {
    launch(std::integral_constant<int, 2>{});
  } else if (M <= 24) {
    launch(std::integral_constant<int, 3>{});
  } else if (M <= 32) {
    launch(std::integral_constant<int, 4>{});
  } else if (M <= 48) {
    launch(std::integral_constant<int, 6>{});
  } else {
    launch(std::integral_constant<int, 8>{});
  }
}

// A 16-bit weight stored row-major (b itself, [K, N]) is read in place; other layouts of b are
// read as w = b.t(), K-contiguous, copied so where they are not.
template <typename T>
void skinny_typed(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) {
  skinny::check_extents(a, b, "skinny");
  const auto [x, ldx] = skinny::tokens<T>(a);
  if constexpr (sizeof(T) == 2) {
    if (skinny::row_major(b)) return launch_for_tokens<T, true>(x, ldx, b, b.stride(0), out);
  }
  const auto [w, ldw] = skinny::batch_weights(b, false).first;
  launch_for_tokens<T, false>(x, ldx, w, ldw, out);
}

void skinny(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) {
  MM_VARIANTS_DISPATCH_CUDA_DTYPES(a.scalar_type(), "mm_variants_cuda_skinny",
                                   [&] { skinny_typed<scalar_t>(a, b, out); });
}

// One launch for a batch, the weights read as for a single product: 16-bit row-major entries in
// place, others as w = b^T per entry, K-contiguous (skinny::batch_weights).
template <typename T>
void launch_batch(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) {
  const int64_t M = a.size(1), N = b.size(-1);
  at::Tensor out0 = out.select(0, 0).narrow(0, 0, M * N).view({M, N});
  const auto [x, x_stride] = skinny::batch_tokens<T>(a);
  const bool n_major = sizeof(T) == 2 && skinny::row_major(b.dim() == 2 ? b : b.select(0, 0));
  const auto [w, w_stride] = skinny::batch_weights(b, n_major);
  const skinny::Batch batch{a.size(0), x_stride, w_stride, out.stride(0)};
  if constexpr (sizeof(T) == 2) {
    if (n_major) return launch_for_tokens<T, true>(x.data, x.ld, w.data, w.ld, out0, batch);
  }
  launch_for_tokens<T, false>(x.data, x.ld, w.data, w.ld, out0, batch);
}

// A whole bmm batch (run_batched; registry.h gives the layout of out): the batch is the grid's
// third dimension, each block offsetting its operands by its entry's strides; K is split where all
// entries' blocks together leave SMs idle (skinny::split_for).
// A batch of decode-sized products (a few tokens against small matrices each, as attention's are
// at decode) then costs one launch where it took one per entry.
void skinny_batched(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) {
  MM_VARIANTS_DISPATCH_CUDA_DTYPES(a.scalar_type(), "mm_variants_cuda_skinny_batched", [&] {
    skinny::in_grid_sized_parts(a, b, out, "skinny", launch_batch<scalar_t>);
  });
}

// Where `auto` passes a product, or each entry of a batch, on to rung 8 (skinny.cuh says why).
bool lower_rung_is_faster(const at::Tensor& a, const at::Tensor& b, int64_t /*entries*/) {
  return skinny::rung8_is_faster_on_row_major(a, b);
}

// mma.sync with bf16 and tf32 needs sm_80.
MM_VARIANTS_REGISTER({"skinny", c10::kCUDA, 10, cuda_dtypes(), &skinny, &sm80_or_newer,
                      &skinny::few_rows, skinny::kFewRowsOnly, /*auto_candidate=*/true,
                      /*run_fused=*/nullptr, &skinny_batched, &lower_rung_is_faster});

}  // namespace
}  // namespace mm_variants::cuda
