// Rung 8, tensor_core: the warp-tiled kernel of rung 7 with its inner product moved from CUDA-core
// FMAs to the tensor cores, and the global -> shared traffic made asynchronous.
//
// - mma.sync: one warp instruction computes a 16x8x16 (fp16/bf16) or 16x8x8 (tf32) product with
//   float accumulation, 2048 or 1024 multiply-adds where a warp-wide FFMA does 32; each warp still
//   owns a WM x WN tile of C.
// - ldmatrix: a warp loads its A and B fragments straight from shared memory in the layout mma
//   expects, four 8x8 matrices per instruction; .trans turns M- or N-contiguous tiles (transposed
//   operands, e.g. B = w.t() of an nn.Linear weight is K-contiguous, B = x is N-contiguous) into
//   the same fragments, so no layout is ever copied. 32-bit tiles stored that way have no .trans
//   and are read by conflict-free scalar loads instead.
// - cp.async: a kStages-deep ring of shared-memory tiles is filled while the tensor cores work on
//   an older stage, without staging through registers; each thread's copy addresses are computed
//   once, its zero-fill form predicates the M, N and K edges (tiles wholly inside the matrix copy
//   without predicates), and the copies are issued between MMAs. Each row's 16-byte chunks are
//   swizzled (mma.cuh): the copies write whole 128-byte lines and the fragment loads hit 32
//   distinct banks, so shared memory, which both share with ldmatrix, does no wasted cycles. A
//   fragment load's address is a per-lane base, one XOR with a constant and a constant offset
//   folded into the instruction: the warps that feed the tensor cores spend their issue slots on
//   little else.
// - Epilogue: each warp stages 16 rows of its tile in shared memory and writes them with 16-byte
//   stores in the input dtype. Thread blocks walk C in groups of kGroupM tile rows so that blocks
//   resident at the same time share their A and B panels in L2.
// - Outputs of too few tiles to fill half the SMs (a hundred rows against a large weight) split
//   K over the blocks, each range's sums stored in float32, and add them in a second pass
//   (k_splits).
// - mm_variants::linear's bias and activation are applied to the float32 sums as they are
//   staged (epilogue.cuh), for the nn.Linear layout x @ w.t(); a bmm batch runs in one launch,
//   batch entries along gridDim.y. Both are template arguments: the plain matmul's code is
//   unchanged by them.
//
// Tile parameters (TensorCoreTiling): BM x BN block tile, BK_BYTES of K per stage (64 fp16/bf16
// or 32 float elements for 128 bytes), WM x WN warp tile, kStages pipeline depth; LargeTiling
// where the GPU gives a block 144 KB of shared memory, SmallTiling (one stage less) elsewhere.
// LargeTiling won the sweep of `scripts/tune_tiling.py --rung tensor_core` (H200; bf16, fp16 and
// TF32 at 4096^3 and 8192^3) against 2-block, 16-warp, 256 x 128 and 4-stage candidates, with
// padded tiles. Swizzled, 4 stages timed the same for 16 bits and at most 4% faster for TF32,
// and 192 KB would leave an A100 with SmallTiling. B stored K-outer takes DeepTiling where it
// fits (H100, H200): see there.
//
// float32 inputs run in TF32 (10-bit mantissa, rounded to nearest, float accumulation) where the
// user allows it for matmuls, as for torch.mm: torch.backends.cuda.matmul.allow_tf32 = True or
// torch.set_float32_matmul_precision("high" / "medium"). Otherwise (PyTorch's default) they run
// in 3xTF32 (Split3xTf32Tiling): three TF32 MMAs per product of split operands, with float32's
// accuracy, at a third of TF32's rate, which on Hopper is still faster than float32 FMAs.
//
// Operands whose pointer or leading dimension is not 16-byte aligned cannot use 16-byte cp.async;
// they take a slower path chosen at launch that fills the same shared tiles with predicated
// element loads.
#include "../matmul.h"
#include "common.cuh"
#include "epilogue.cuh"
#include "k_splits.cuh"
#include "mma.cuh"

#include <ATen/Context.h>
#include <ATen/ops/empty.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace mm_variants::cuda {
namespace {

template <int BM_, int BN_, int BK_BYTES_, int WM_, int WN_, int STAGES_, int MIN_BLOCKS_,
          bool SPLIT_TF32_ = false>
struct TensorCoreTiling {
  static constexpr int BM = BM_, BN = BN_, BK_BYTES = BK_BYTES_, WM = WM_, WN = WN_;
  static constexpr int kStages = STAGES_, kMinBlocks = MIN_BLOCKS_;
  static constexpr bool kSplitTf32 = SPLIT_TF32_;  // float32 in 3xTF32 (see Split3xTf32Tiling)
};

// 8 warps of 64 x 64 over a 128 x 256 tile, 48 KB per stage: three stages (144 KB) for
// LargeTiling (A100, H100), two (96 KB) for SmallTiling (GPUs with 99 KB per block). Deep K
// stages mean fewer barriers per MMA, and 128-byte rows are what the swizzle permutes.
// -DMM_VARIANTS_TENSOR_CORE overrides LargeTiling for a sweep.
#ifndef MM_VARIANTS_TENSOR_CORE  // BM, BN, BK_BYTES, WM, WN, STAGES, MIN_BLOCKS
#define MM_VARIANTS_TENSOR_CORE 128, 256, 128, 64, 64, 3, 1
#endif
using LargeTiling = TensorCoreTiling<MM_VARIANTS_TENSOR_CORE>;
using SmallTiling = TensorCoreTiling<128, 256, 128, 64, 64, 2, 1>;
// Two stages of 256 bytes of k (192 KB): one barrier per 8 MMA steps instead of 4. With B stored
// K-outer they ran faster than LargeTiling at 4096^3 and 8192^3 (H200, beside it): TF32, whose B
// fragments then take scalar loads, 3-6% with row-major A (four rounds) and 8.5% and 3.7% with A
// transposed (the weight gradient's layout, three rounds); bf16 and fp16 1-4% with row-major A
// and 0-2% with A transposed (three rounds). With B K-contiguous (the nn.Linear layout) TF32 ran
// 3-5% slower, the 16-bit kernels spill registers and gained nothing clear (-3% to +6%), and with
// both operands transposed they lost 2-3.5%; those keep LargeTiling. GPUs without 192 KB of
// shared memory per block (A100) keep it too.
using DeepTiling = TensorCoreTiling<128, 256, 256, 64, 64, 2, 1>;
// float32 with TF32 off runs in 3xTF32: each operand is split into its TF32 rounding and the rest
// (mma::split_tf32), and three TF32 MMAs (small x big, big x small, big x big) give float32's
// accuracy at a third of TF32's rate, still above what CUDA cores do in float32. The tensor core
// does not round its accumulation to nearest, and over a long K one chain of MMAs per output
// would lose float32's accuracy: each K tile's products are summed afresh and added to the
// running sums with float32 adds. Two sets of sums take warp tiles of 64 x 32, which move more
// shared-memory bytes per multiply-add than TF32's 64 x 64; with three MMAs per product that
// traffic is far from shared memory's limit by the count in tensor_core.md. Three stages (96 KB)
// fit every sm_80+ GPU.
using Split3xTf32Tiling = TensorCoreTiling<128, 128, 128, 64, 32, 3, 1, true>;

// Whether problem G takes DeepTiling where the GPU has its shared memory.
template <class G>
constexpr bool prefers_deep_tiling() {
  return !decltype(G::b)::k_contiguous;
}

constexpr int kGroupM = 8;  // tile rows per group of the grouped tile order (tile_origin)

// The tensor-core instruction for each input dtype. Fragments hold raw bits: two 16-bit elements
// or one 32-bit element per register.
template <typename T>
struct MmaOp;

template <>
struct MmaOp<c10::Half> {
  static constexpr int kK = 16;
  __device__ static void run(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
    mma::mma_m16n8k16_f16(d, a, b);
  }
  __device__ static uint32_t prepare(uint32_t x) { return x; }
  __device__ static uint32_t pack(float x, float y) { return mma::pack_half2(x, y); }
};

template <>
struct MmaOp<c10::BFloat16> {
  static constexpr int kK = 16;
  __device__ static void run(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
    mma::mma_m16n8k16_bf16(d, a, b);
  }
  __device__ static uint32_t prepare(uint32_t x) { return x; }
  __device__ static uint32_t pack(float x, float y) { return mma::pack_bfloat162(x, y); }
};

template <>
struct MmaOp<float> {
  static constexpr int kK = 8;
  __device__ static void run(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
    mma::mma_m16n8k8_tf32(d, a, b);
  }
  __device__ static uint32_t prepare(uint32_t x) { return mma::round_to_tf32(x); }
};

// One MMA step of 3xTF32 on raw float32 fragments: with a = a_big + a_small and b likewise
// (mma::split_tf32), d += a_small b_big + a_big b_small + a_big b_big. The dropped a_small b_small
// is under 2^-22 of the product. A's split is done per 16-row piece, B's once per step, which
// keeps a few registers live beside the two sets of sums.
template <int kMTiles, int kNTiles>
__device__ __forceinline__ void mma_3xtf32(float (&d)[kMTiles][kNTiles][4],
                                           const uint32_t (&a)[kMTiles][4],
                                           const uint32_t (&b)[kNTiles][2]) {
  uint32_t b_big[kNTiles][2], b_small[kNTiles][2];
#pragma unroll
  for (int ni = 0; ni < kNTiles; ++ni) {
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      const mma::Tf32Parts parts = mma::split_tf32(b[ni][q]);
      b_big[ni][q] = parts.big;
      b_small[ni][q] = parts.small;
    }
  }
#pragma unroll
  for (int mi = 0; mi < kMTiles; ++mi) {
    uint32_t a_big[4], a_small[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const mma::Tf32Parts parts = mma::split_tf32(a[mi][q]);
      a_big[q] = parts.big;
      a_small[q] = parts.small;
    }
    // Three passes over the columns, so that MMAs into the same sums are kNTiles apart.
#pragma unroll
    for (int ni = 0; ni < kNTiles; ++ni) mma::mma_m16n8k8_tf32(d[mi][ni], a_small, b_big[ni]);
#pragma unroll
    for (int ni = 0; ni < kNTiles; ++ni) mma::mma_m16n8k8_tf32(d[mi][ni], a_big, b_small[ni]);
#pragma unroll
    for (int ni = 0; ni < kNTiles; ++ni) mma::mma_m16n8k8_tf32(d[mi][ni], a_big, b_big[ni]);
  }
}

// sums += fresh in float32 (rounded to nearest), then fresh = 0 for the next K tile.
template <int kMTiles, int kNTiles>
__device__ __forceinline__ void add_and_clear(float (&sums)[kMTiles][kNTiles][4],
                                              float (&fresh)[kMTiles][kNTiles][4]) {
#pragma unroll
  for (int mi = 0; mi < kMTiles; ++mi) {
#pragma unroll
    for (int ni = 0; ni < kNTiles; ++ni) {
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        sums[mi][ni][q] += fresh[mi][ni][q];
        fresh[mi][ni][q] = 0.0f;
      }
    }
  }
}

// Elements are moved as raw bits; only the MMA and the epilogue know the dtype.
template <typename T>
using Bits = std::conditional_t<sizeof(T) == 2, uint16_t, uint32_t>;

// The shared-memory geometry of one kernel: tiling C, problem G (dtype and operand layouts).
template <class C, class G>
struct Tiles {
  using T = typename G::scalar;
  using E = Bits<T>;
  static constexpr bool kAK = decltype(G::a)::k_contiguous;  // row-major A
  static constexpr bool kBK = decltype(G::b)::k_contiguous;  // column-major B
  static constexpr int kElem = sizeof(T);
  static constexpr int BK = C::BK_BYTES / kElem;
  static constexpr int kWarpsM = C::BM / C::WM, kWarps = kWarpsM * (C::BN / C::WN);
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kMmaK = MmaOp<T>::kK;
  static constexpr int kChunk = 16 / kElem;  // elements per 16-byte chunk, half of kMmaK
  static constexpr int kMTiles = C::WM / 16, kNTiles = C::WN / 8;
  static constexpr int kSlices = BK / kMmaK;  // MMA steps per stage
  static constexpr bool kSplit = C::kSplitTf32;
  static_assert(!kSplit || std::is_same_v<T, float>, "3xTF32 splits float32 operands");

  // A stage stores each operand as its global layout does: A as [BM][BK] (K-contiguous) or
  // [BK][BM], B as [BN][BK] or [BK][BN], the 16-byte chunks of each row swizzled (mma::Swizzle)
  // for the loads that read it: ldmatrix, or scalar loads for 32-bit tiles stored K-outer.
  static constexpr bool kALdmatrix = kAK || kElem == 2, kBLdmatrix = kBK || kElem == 2;
  using ASwizzle = mma::Swizzle<kALdmatrix>;
  using BSwizzle = mma::Swizzle<kBLdmatrix>;
  static constexpr int kAOuter = kAK ? C::BM : BK, kAInner = kAK ? BK : C::BM;
  static constexpr int kBOuter = kBK ? C::BN : BK, kBInner = kBK ? BK : C::BN;
  static constexpr int kAStage = kAOuter * kAInner, kBStage = kBOuter * kBInner;

  // Epilogue: each warp stages 16 rows of its tile, in float32 for the sums of a K range (KRanges)
  // and in the dtype otherwise; the pitch spreads the pair stores of a warp over all banks (4 words
  // mod 32 for 16-bit pairs, 8 words mod 32 for float pairs).
  static constexpr int kEpiPitch = C::WN + 8;
  static constexpr int kEpiWarp = 16 * kEpiPitch;

  static constexpr int kSmemBytes = static_cast<int>(std::max(
      C::kStages * (kAStage + kBStage) * kElem, kWarps * kEpiWarp * int(sizeof(float))));

  static_assert(C::BM % C::WM == 0 && C::BN % C::WN == 0 && C::WM % 16 == 0 && C::WN % 16 == 0,
                "warp tiles must tile the block and be made of 16 x 16 pieces");
  static_assert(BK % kMmaK == 0 && kSlices % 2 == 0, "fragments alternate between two sets");
  static_assert(C::kStages >= 2, "the pipeline needs at least two stages");
  static_assert(C::WM * kElem % 128 == 0 && C::WN * kElem % 128 == 0,
                "a warp's first column of a K-outer tile starts a swizzle pattern (8 chunks)");
  static_assert((kAOuter * kAInner / kChunk) % kThreads == 0 &&
                (kBOuter * kBInner / kChunk) % kThreads == 0,
                "every thread copies the same number of chunks");
  static_assert((16 * C::WN / kChunk) % 32 == 0 && (16 * C::WN / 4) % 32 == 0,
                "every lane stores the same chunks of the staged rows");
};

// The problem of one launch: the plain matmul and linear's fused one.
struct SingleEntry {
  static constexpr int64_t a = 0, b = 0;  // no other entries, so no strides between them
  static constexpr bool kFloatSums = false;  // the output is stored in the inputs' dtype

  template <class G>
  __device__ __forceinline__ const G& at(const G& g, int64_t) const {
    return g;
  }
};

// A batch of problems like g, entry i's operands and output i times these strides (in elements)
// after entry 0's; b is 0 for a b shared by every entry. The kernel runs entry blockIdx.y.
struct BatchStrides {
  int64_t a, b, c;
  static constexpr bool kFloatSums = false;

  template <class G>
  __host__ __device__ __forceinline__ G at(G g, int64_t i) const {
    g.a.data += i * a;
    g.b.data += i * b;
    g.c += i * c;
    return g;
  }
};

// The ranges of one product's K (launch_split) as a batch: entry i starts i times these strides
// into a and b, covers g.K of K (the last one what is left of k_total), and stores its sums as
// float32, whatever the inputs' dtype, in slice i of a buffer that g.c points at.
struct KRanges {
  int64_t a, b, slice;
  int64_t k_total;
  static constexpr bool kFloatSums = true;

  template <class G>
  __host__ __device__ __forceinline__ G at(G g, int64_t i) const {
    g.a.data += i * a;
    g.b.data += i * b;
    g.c = reinterpret_cast<typename G::scalar*>(reinterpret_cast<float*>(g.c) + i * slice);
    const int64_t k_left = k_total - i * g.K;
    if (k_left < g.K) g.K = static_cast<int>(k_left);
    return g;
  }
};

// The 16-byte cp.async copy of one operand's K tiles into shared memory. The tile is
// kOuter x kInner with its inner dimension contiguous in global memory (element (o, i) at
// origin[o * ld + i]) and stored swizzled by Sw; K is the outer dimension when kKOuter, else the
// inner one. Each thread
// moves the same chunks of every K tile, so its addresses are computed once. Copies past the
// matrix edges are zero-filled (partly, in the last chunk of a row), and K tiles past the end
// read as zeros: the pipeline issues them without a branch.
template <int kOuter, int kInner, class Sw, int kThreads, bool kKOuter, typename E>
struct AsyncTileCopy {
  static constexpr int kChunk = 16 / sizeof(E);
  static constexpr int kChunksPerRow = kInner / kChunk;
  static constexpr int kRowsPerPass = kThreads / kChunksPerRow;
  static constexpr int kPasses = kOuter / kRowsPerPass;
  static_assert(kThreads % kChunksPerRow == 0 && kOuter % kRowsPerPass == 0,
                "every thread copies the same chunks of every row pass");
  static_assert(kRowsPerPass % Sw::kPeriod == 0, "a thread's chunks share one swizzle");
  static constexpr int kPassBytes = kRowsPerPass * kInner * sizeof(E);

  // The operand's own values (base pointer, ld, K, the tile's extent) stay kernel parameters;
  // a thread keeps only its first chunk's address and position.
  const E* src;  // this thread's first chunk in K tile 0
  int row, col;  // this thread's first row and its column in the tile

  // x0: the tile's first row of A (m) or column of B (n).
  __device__ __forceinline__ AsyncTileCopy(const E* data, int64_t ld, int x0)
      : row(threadIdx.x / kChunksPerRow), col(threadIdx.x % kChunksPerRow * kChunk) {
    src = kKOuter ? data + row * ld + x0 + col : data + (int64_t(x0) + row) * ld + col;
  }

  // Issues this thread's copies of K tile kt when the whole tile lies inside the matrix: whole
  // 16-byte chunks, no predicates, one address add per copy. Most tiles are like this; the
  // general issue() below costs several times the instructions per copy, and the copies share
  // the issue slots of the warps that feed the tensor cores.
  __device__ __forceinline__ void issue_whole(uint32_t stage, int kt, int64_t ld) const {
    const E* tile = src + (kKOuter ? int64_t(kt) * kOuter * ld : int64_t(kt) * kInner);
    const uint32_t dst = stage + Sw::template offset<kInner, sizeof(E)>(row, col) * sizeof(E);
#pragma unroll
    for (int i = 0; i < kPasses; ++i) {
      mma::cp_async_16(dst + i * kPassBytes, tile + i * kRowsPerPass * ld, 16);
    }
  }

  // Whether K tiles of this block's operand are whole where K is: x_left as for issue().
  __host__ __device__ static constexpr bool whole_across(int x_left) {
    return x_left >= (kKOuter ? kInner : kOuter);
  }

  // Issues this thread's copies of K tile kt into the stage at shared address `stage`. x_left:
  // rows (K inner) or columns (K outer) of the tile inside the matrix; `base`: any valid
  // address of the operand, the source of empty copies.
  __device__ __forceinline__ void issue(uint32_t stage, int kt, const E* base, int64_t ld, int K,
                                        int x_left) const {
    const int k0 = kt * (kKOuter ? kOuter : kInner);
    const E* tile = src + (kKOuter ? int64_t(k0) * ld : int64_t(k0));
    // Elements of this thread's chunk inside the matrix, and rows left from its first row.
    const int chunk = min(max(kKOuter ? x_left - col : K - k0 - col, 0), kChunk);
    const int rows_left = (kKOuter ? K - k0 : x_left) - row;
    const uint32_t dst = stage + Sw::template offset<kInner, sizeof(E)>(row, col) * sizeof(E);
#pragma unroll
    for (int i = 0; i < kPasses; ++i) {
      const int bytes = i * kRowsPerPass < rows_left ? chunk * static_cast<int>(sizeof(E)) : 0;
      mma::cp_async_16(dst + i * kPassBytes, bytes > 0 ? tile + i * kRowsPerPass * ld : base,
                       bytes);
    }
  }
};

// The same tile as AsyncTileCopy, element by element: for operands whose pointer or leading
// dimension is not 16-byte aligned. Fills the same shared layout; outside the matrix, zeros.
template <int kOuter, int kInner, class Sw, int kThreads, typename E>
__device__ __forceinline__ void copy_tile_elementwise(E* dst, const E* src, int64_t ld,
                                                      int outer_left, int inner_left) {
#pragma unroll 4
  for (int i = 0; i < kOuter * kInner / kThreads; ++i) {
    const int e = threadIdx.x + i * kThreads;
    const int o = e / kInner, x = e % kInner;
    dst[Sw::template offset<kInner, sizeof(E)>(o, x)] =
        o < outer_left && x < inner_left ? src[o * ld + x] : E(0);
  }
}

// Epi (epilogue.cuh) maps each float32 sum of column n before it is rounded; Batch (SingleEntry,
// BatchStrides or KRanges) picks the block's problem.
template <class C, typename G, class Epi, class Batch>
__global__ void __launch_bounds__(Tiles<C, G>::kThreads, C::kMinBlocks)
    tensor_core_kernel(G problem, bool a_vec16, bool b_vec16, Epi epi, Batch batch) {
  using L = Tiles<C, G>;
  using T = typename L::T;
  using E = typename L::E;
  extern __shared__ float4 smem_vec[];
  E* const a_smem = reinterpret_cast<E*>(smem_vec);
  E* const b_smem = a_smem + C::kStages * L::kAStage;
  const G g = batch.at(problem, blockIdx.y);
  const E* const a = reinterpret_cast<const E*>(g.a.data);
  const E* const b = reinterpret_cast<const E*>(g.b.data);
  // Empty copies need any valid address of the operand: entry 0's, a kernel parameter, spends no
  // register in a batch.
  const E* const a_base = reinterpret_cast<const E*>(problem.a.data);
  const E* const b_base = reinterpret_cast<const E*>(problem.b.data);

  const int2 tile = tile_origin<C::BM, C::BN, kGroupM>(g);
  const int m0 = tile.x, n0 = tile.y;
  const int m_left = min(g.M - m0, C::BM), n_left = min(g.N - n0, C::BN);
  const int k_tiles = (g.K - 1) / L::BK + 1;

  const AsyncTileCopy<L::kAOuter, L::kAInner, typename L::ASwizzle, L::kThreads, !L::kAK, E>
      a_copy(a, g.a.ld, m0);
  const AsyncTileCopy<L::kBOuter, L::kBInner, typename L::BSwizzle, L::kThreads, !L::kBK, E>
      b_copy(b, g.b.ld, n0);
  const uint32_t a_stages = mma::smem_addr(a_smem), b_stages = mma::smem_addr(b_smem);
  // Both operands 16-byte aligned: every stage is a run of cp.async, predicate-free for the
  // tiles that lie wholly inside the matrix (all but the last K tile and the edge blocks). Tiles
  // past the last one are never read, so they are not copied.
  const int whole_k_tiles = g.K / L::BK;
  const bool a_whole = a_copy.whole_across(m_left), b_whole = b_copy.whole_across(n_left);
  const auto async_stage = [&](int stage, int kt) {
    const uint32_t a_stage = a_stages + stage * L::kAStage * L::kElem;
    const uint32_t b_stage = b_stages + stage * L::kBStage * L::kElem;
    if (kt < whole_k_tiles && a_whole) {
      a_copy.issue_whole(a_stage, kt, g.a.ld);
    } else if (kt < k_tiles) {
      a_copy.issue(a_stage, kt, a_base, g.a.ld, g.K, m_left);
    }
    if (kt < whole_k_tiles && b_whole) {
      b_copy.issue_whole(b_stage, kt, g.b.ld);
    } else if (kt < k_tiles) {
      b_copy.issue(b_stage, kt, b_base, g.b.ld, g.K, n_left);
    }
  };
  // Otherwise each operand copies as it can; K tiles past the end are skipped.
  const auto mixed_stage = [&](int stage, int kt) {
    if (kt >= k_tiles) return;
    const int k0 = kt * L::BK, k_left = min(g.K - k0, L::BK);
    if (a_vec16) {
      a_copy.issue(a_stages + stage * L::kAStage * L::kElem, kt, a_base, g.a.ld, g.K, m_left);
    } else if constexpr (L::kAK) {
      copy_tile_elementwise<C::BM, L::BK, typename L::ASwizzle, L::kThreads>(
          a_smem + stage * L::kAStage, a + int64_t(m0) * g.a.ld + k0, g.a.ld, m_left, k_left);
    } else {
      copy_tile_elementwise<L::BK, C::BM, typename L::ASwizzle, L::kThreads>(
          a_smem + stage * L::kAStage, a + int64_t(k0) * g.a.ld + m0, g.a.ld, k_left, m_left);
    }
    if (b_vec16) {
      b_copy.issue(b_stages + stage * L::kBStage * L::kElem, kt, b_base, g.b.ld, g.K, n_left);
    } else if constexpr (L::kBK) {
      copy_tile_elementwise<C::BN, L::BK, typename L::BSwizzle, L::kThreads>(
          b_smem + stage * L::kBStage, b + int64_t(n0) * g.b.ld + k0, g.b.ld, n_left, k_left);
    } else {
      copy_tile_elementwise<L::BK, C::BN, typename L::BSwizzle, L::kThreads>(
          b_smem + stage * L::kBStage, b + int64_t(k0) * g.b.ld + n0, g.b.ld, k_left, n_left);
    }
  };

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int warp_m = warp % L::kWarpsM * C::WM, warp_n = warp / L::kWarpsM * C::WN;
  // ldmatrix: lanes 8j .. 8j + 7 address the rows r of matrix j. Scalar 32-bit fragment loads:
  // lane (g, t) reads row or column g at k = t and t + 4.
  const int j = lane / 8, r = lane % 8, gq = lane / 4, tq = lane % 4;

  // This lane's place in a stage for the warp's first 16-row piece of A and 16-column piece of B
  // at k = 0: its row, and its swizzled column. Every row an ldmatrix lane reads is r modulo 8,
  // and every row a scalar load reads is t modulo 4, so the swizzle mask is the same for all of a
  // lane's loads. Other pieces and k steps lie a constant number of rows away, or an even number
  // of chunks across while the lane's own chunk is 0 or 1 (bits that do not overlap): the column
  // of each load is the lane's swizzled column XOR a constant, and its row offset folds into the
  // instruction's address offset.
  const int a_row = L::kAK ? warp_m + j % 2 * 8 + r : (L::kALdmatrix ? j / 2 * 8 + r : tq);
  const int a_col = (L::kALdmatrix ? (L::kAK ? j / 2 : j % 2) * L::kChunk : gq) ^
                    L::ASwizzle::mask(a_row) * L::kChunk;
  const int b_row = L::kBK ? warp_n + j / 2 * 8 + r : (L::kBLdmatrix ? j % 2 * 8 + r : tq);
  const int b_col = (L::kBLdmatrix ? (L::kBK ? j % 2 : j / 2) * L::kChunk : gq) ^
                    L::BSwizzle::mask(b_row) * L::kChunk;
  // Bytes from a stage's start to the lane's row and to the warp's first column.
  const uint32_t a_lane = (a_row * L::kAInner + (L::kAK ? 0 : warp_m)) * L::kElem;
  const uint32_t b_lane = (b_row * L::kBInner + (L::kBK ? 0 : warp_n)) * L::kElem;
  // A scalar load's column x (a multiple of 8) from the lane's swizzled column, which is under
  // 32: only x's low five bits meet the XOR, so a lane keeps four columns, not one per load.
  const auto scalar_col = [](int lane_col, int x) { return (lane_col ^ x % 32) + x / 32 * 32; };

  // 3xTF32 splits the raw fragments when it multiplies them; TF32 rounds them as they load.
  const auto prepare = [](uint32_t x) { return L::kSplit ? x : MmaOp<T>::prepare(x); };
  // The fragments of the MMA step at k offset kk of stage `stage`.
  const auto load_a = [&](uint32_t(&frag)[L::kMTiles][4], int stage, int kk) {
    const uint32_t lane_at = a_stages + stage * L::kAStage * L::kElem + a_lane;
#pragma unroll
    for (int mi = 0; mi < L::kMTiles; ++mi) {
      if constexpr (L::kAK) {  // [m][k]: matrix j is rows m + 8 (j % 2), k chunk j / 2
        mma::ldmatrix_x4(frag[mi],
                         lane_at + (mi * 16 * L::kAInner + (a_col ^ kk)) * L::kElem);
      } else if constexpr (L::kElem == 2) {  // [k][m], transposed by ldmatrix: k rows j / 2
        mma::ldmatrix_x4_trans(frag[mi],
                               lane_at + (kk * L::kAInner + (a_col ^ mi * 16)) * L::kElem);
      } else {  // [k][m] 32-bit: a0 (g, t), a1 (g + 8, t), a2 (g, t + 4), a3 (g + 8, t + 4)
        const E* p = a_smem + stage * L::kAStage + a_lane / L::kElem + kk * L::kAInner;
        frag[mi][0] = p[scalar_col(a_col, mi * 16)];
        frag[mi][1] = p[scalar_col(a_col, mi * 16 + 8)];
        frag[mi][2] = p[4 * L::kAInner + scalar_col(a_col, mi * 16)];
        frag[mi][3] = p[4 * L::kAInner + scalar_col(a_col, mi * 16 + 8)];
      }
#pragma unroll
      for (int q = 0; q < 4; ++q) frag[mi][q] = prepare(frag[mi][q]);
    }
  };
  const auto load_b = [&](uint32_t(&frag)[L::kNTiles][2], int stage, int kk) {
    const uint32_t lane_at = b_stages + stage * L::kBStage * L::kElem + b_lane;
#pragma unroll
    for (int np = 0; np < L::kNTiles / 2; ++np) {  // two 8-column MMA tiles per load
      uint32_t x[4];
      if constexpr (L::kBK) {  // [n][k]: matrix j is rows n + 8 (j / 2), k chunk j % 2
        mma::ldmatrix_x4(x, lane_at + (np * 16 * L::kBInner + (b_col ^ kk)) * L::kElem);
      } else if constexpr (L::kElem == 2) {  // [k][n], transposed by ldmatrix: k rows j % 2
        mma::ldmatrix_x4_trans(x, lane_at + (kk * L::kBInner + (b_col ^ np * 16)) * L::kElem);
      } else {  // [k][n] 32-bit: b0 (t, g), b1 (t + 4, g) of columns n and n + 8
        const E* p = b_smem + stage * L::kBStage + b_lane / L::kElem + kk * L::kBInner;
        x[0] = p[scalar_col(b_col, np * 16)];
        x[1] = p[4 * L::kBInner + scalar_col(b_col, np * 16)];
        x[2] = p[scalar_col(b_col, np * 16 + 8)];
        x[3] = p[4 * L::kBInner + scalar_col(b_col, np * 16 + 8)];
      }
#pragma unroll
      for (int q = 0; q < 4; ++q) frag[2 * np + q / 2][q % 2] = prepare(x[q]);
    }
  };

  float acc[L::kMTiles][L::kNTiles][4] = {};
  // 3xTF32: the current K tile's products, added to acc after its last MMA step.
  float fresh[L::kMTiles][L::kNTiles][4] = {};

  // Pipeline: stage kt % kStages holds K tile kt, whose copies were issued kStages - 1 iterations
  // earlier. Fragments are double-buffered: the registers of the next MMA step (or of the next
  // tile's first step) load while the tensor cores work on the current one. The one barrier per
  // tile comes before the last step's MMAs, whose fragments are already in registers: past it the
  // next tile is visible to every warp, and no warp still reads the stage refilled next. The
  // refill is issued after the first step's MMAs, so the copies overlap tensor-core work.
  const auto mainloop = [&](const auto& load_stage) {
#pragma unroll
    for (int s = 0; s < C::kStages - 1; ++s) {
      load_stage(s, s);
      mma::cp_async_commit();
    }
    mma::cp_async_wait<C::kStages - 2>();
    __syncthreads();

    uint32_t a_frag[2][L::kMTiles][4], b_frag[2][L::kNTiles][2];
    load_a(a_frag[0], 0, 0);
    load_b(b_frag[0], 0, 0);
    for (int kt = 0; kt < k_tiles; ++kt) {
      const int stage = kt % C::kStages;
      const int following = kt + 1 < k_tiles ? (kt + 1) % C::kStages : stage;
#pragma unroll
      for (int ks = 0; ks < L::kSlices; ++ks) {
        if (ks == L::kSlices - 1) {
          mma::cp_async_wait<C::kStages - 2>();
          __syncthreads();
        }
        const int from = ks == L::kSlices - 1 ? following : stage;
        const int kk = (ks + 1) % L::kSlices * L::kMmaK;
        load_a(a_frag[(ks + 1) % 2], from, kk);
        load_b(b_frag[(ks + 1) % 2], from, kk);
        if constexpr (L::kSplit) {
          mma_3xtf32(fresh, a_frag[ks % 2], b_frag[ks % 2]);
          if (ks == L::kSlices - 1) add_and_clear(acc, fresh);
        } else {
#pragma unroll
          for (int mi = 0; mi < L::kMTiles; ++mi) {
#pragma unroll
            for (int ni = 0; ni < L::kNTiles; ++ni) {
              MmaOp<T>::run(acc[mi][ni], a_frag[ks % 2][mi], b_frag[ks % 2][ni]);
            }
          }
        }
        if (ks == 0) {
          const int ahead = kt + C::kStages - 1;
          load_stage(ahead % C::kStages, ahead);
          mma::cp_async_commit();
        }
      }
    }
  };
  if (a_vec16 && b_vec16) {
    mainloop(async_stage);
  } else {
    mainloop(mixed_stage);
  }
  mma::cp_async_wait<0>();
  __syncthreads();  // the stages are reused below

  // Epilogue, 16 rows of the warp tile at a time: the accumulator pairs C[g][2t, 2t + 1] and
  // C[g + 8][2t, 2t + 1] of each 8-column tile go through epi to shared memory in the output
  // dtype (float32 for the sums of a K range), then each lane writes 16-byte chunks of whole rows.
  using O = std::conditional_t<Batch::kFloatSums, float, T>;
  using OE = Bits<O>;
  constexpr int kOutChunk = 16 / sizeof(O);
  OE* const staged = reinterpret_cast<OE*>(smem_vec) + warp * L::kEpiWarp;
  OE* const out = reinterpret_cast<OE*>(g.c);
  constexpr int kRowChunks = C::WN / kOutChunk;
  // 3xTF32 gives NaN for some sums that float32 makes infinite (mma::split_tf32): those are
  // summed again in float32.
  const auto sum_of = [&](float sum, int m, int n) {
    if constexpr (L::kSplit) {
      if (isnan(sum) && m < g.M && n < g.N) {
        return mma::plain_dot(reinterpret_cast<const float*>(g.a.at(m, 0)), g.a.k_step(),
                              reinterpret_cast<const float*>(g.b.at(n, 0)), g.b.k_step(), g.K);
      }
    }
    return sum;
  };
  // g.c itself is 16-byte aligned (with_gemm; launch_split's slices).
  const bool out_vec16 = g.N % kOutChunk == 0;
#pragma unroll
  for (int mi = 0; mi < L::kMTiles; ++mi) {
#pragma unroll
    for (int ni = 0; ni < L::kNTiles; ++ni) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        OE* p = staged + (gq + 8 * h) * L::kEpiPitch + ni * 8 + 2 * tq;
        const int m = m0 + warp_m + mi * 16 + gq + 8 * h, n = n0 + warp_n + ni * 8 + 2 * tq;
        const float x = epi(sum_of(acc[mi][ni][2 * h], m, n), n);
        const float y = epi(sum_of(acc[mi][ni][2 * h + 1], m, n + 1), n + 1);
        if constexpr (sizeof(O) == 2) {
          *reinterpret_cast<uint32_t*>(p) = MmaOp<T>::pack(x, y);
        } else {
          *reinterpret_cast<float2*>(p) = make_float2(x, y);
        }
      }
    }
    __syncwarp();
#pragma unroll
    for (int i = 0; i < 16 * kRowChunks / 32; ++i) {
      const int c = lane + 32 * i, row = c / kRowChunks, col = c % kRowChunks * kOutChunk;
      const int m = m0 + warp_m + mi * 16 + row, n = n0 + warp_n + col;
      if (m < g.M && n < g.N) {
        const OE* from = staged + row * L::kEpiPitch + col;
        OE* to = out + int64_t(m) * g.N + n;
        if (out_vec16 && n + kOutChunk <= g.N) {
          *reinterpret_cast<uint4*>(to) = *reinterpret_cast<const uint4*>(from);
        } else {
          for (int e = 0; e < kOutChunk && n + e < g.N; ++e) to[e] = from[e];
        }
      }
    }
    __syncwarp();
  }
}

// Whether every entry of a panel takes 16-byte cp.async: entry 0 does, and entries lie a multiple
// of 16 bytes apart.
template <class P>
bool vec16(const P& panel, int64_t batch_stride) {
  return panel.aligned(16) && batch_stride * sizeof(typename P::scalar) % 16 == 0;
}

// Launches tiling C's kernel for problem g (and, for a batch, the entries - 1 problems after it).
template <class C, class G, class Epi, class Batch>
void run_tiles(const G& g, const Epi& epi, const Batch& batch, unsigned entries) {
  using L = Tiles<C, G>;
  const DeviceInfo& device = device_properties(c10::cuda::current_device());
  const int smem = static_cast<int>(device.sharedMemPerBlockOptin);
  TORCH_CHECK(L::kSmemBytes <= smem, "torch_mm_variants: tensor_core needs ", L::kSmemBytes,
              " bytes of shared memory per block; ", device.name, " has ", smem);
  auto* kernel = tensor_core_kernel<C, G, Epi, Batch>;
  allow_dynamic_smem(kernel, L::kSmemBytes);
  const dim3 grid(tile_grid<C::BM, C::BN>(g).x, entries);
  kernel<<<grid, L::kThreads, L::kSmemBytes, c10::cuda::getCurrentCUDAStream()>>>(
      g, vec16(g.a, batch.a), vec16(g.b, batch.b), epi, batch);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// K splits for outputs of few tiles. At 128 rows against a 4096 x 4096 weight, 3xTF32's
// 128 x 128 tiles number 32 on 132 SMs, and float32 with TF32 off ran at 0.31-0.39x of torch.mm
// there (H100). Such a product splits K over up to kMaxSplits ranges of whole K tiles, each at
// least kMinSplitK long, as many as give the SMs about a block each: a batch whose entry s is
// range s, its float32 sums in slice s of a buffer, added in split order by a second pass
// (k_splits.cuh). Every dtype: the ranges' sums are kept in float32, as the kernel accumulates
// them, so 16-bit outputs are rounded once, as in one launch. (On Hopper `auto` runs 16-bit
// products on rung 9, which splits K itself; this serves the GPUs without it.)
constexpr int kMaxSplits = 16;
constexpr int kMinSplitK = 512;

// The K splits of g in tiling C on `sms` SMs: 1 (none) where its tiles fill half the SMs.
template <class C, class G>
int k_splits(const G& g, int sms) {
  const int64_t tiles = static_cast<int64_t>(ceil_div(g.M, C::BM)) * ceil_div(g.N, C::BN);
  if (2 * tiles > sms) return 1;
  return static_cast<int>(std::clamp<int64_t>(std::min<int64_t>(sms / tiles, g.K / kMinSplitK),
                                              1, kMaxSplits));
}

// Runs problem g as `splits` ranges of K (see k_splits) in one batched launch, each slice of the
// float32 sums buffer starting 16-byte aligned, as the kernel's stores want. The pass that adds
// the ranges applies epi and rounds to the dtype.
template <class C, class G, class Epi>
void launch_split(const G& g, int splits, const Epi& epi) {
  using T = typename G::scalar;
  const int64_t bk = Tiles<C, G>::BK;
  const int64_t per_split = static_cast<int64_t>(ceil_div(ceil_div(g.K, splits), bk)) * bk;
  splits = static_cast<int>(ceil_div(g.K, per_split));
  const int64_t slice = (static_cast<int64_t>(g.M) * g.N + 3) / 4 * 4;
  const at::Tensor sums =
      new_scratch({splits * slice}, at::TensorOptions().dtype(at::kFloat).device(
                                        at::kCUDA, c10::cuda::current_device()));
  G first = g;
  first.c = reinterpret_cast<T*>(sums.data_ptr<float>());
  first.ldc = g.N;
  first.K = static_cast<int>(per_split);
  // Entry s starts s * per_split into K: along the rows of a K-contiguous operand, down the
  // columns of the other kind.
  const KRanges ranges{decltype(G::a)::k_contiguous ? per_split : per_split * g.a.ld,
                       decltype(G::b)::k_contiguous ? per_split : per_split * g.b.ld, slice, g.K};
  run_tiles<C>(first, NoEpilogue{}, ranges, static_cast<unsigned>(splits));
  sum_splits<T>(sums.data_ptr<float>(), slice, splits, g.c, g.M, g.N, g.ldc, epi);
}

// Launches problem g (and, for a batch, the entries - 1 problems after it): float32 with TF32
// off in 3xTF32, otherwise with the tiling that fits the device's shared memory, DeepTiling first
// where G prefers it. A single product of few tiles splits K.
template <class G, class Epi = NoEpilogue, class Batch = SingleEntry>
void launch(const G& g, const Epi& epi = {}, const Batch& batch = {}, unsigned entries = 1) {
  const DeviceInfo& device = device_properties(c10::cuda::current_device());
  const int smem = static_cast<int>(device.sharedMemPerBlockOptin);
  constexpr bool kMaySplit = std::is_same_v<Batch, SingleEntry>;
  const auto launch_tiled = [&](auto tiling) {
    using C = decltype(tiling);
    if constexpr (kMaySplit) {
      const int splits = k_splits<C>(g, device.multiProcessorCount);
      if (splits > 1) return launch_split<C>(g, splits, epi);
    }
    run_tiles<C>(g, epi, batch, entries);
  };
  if constexpr (std::is_same_v<typename G::scalar, float>) {
    if (!at::globalContext().allowTF32CuBLAS()) return launch_tiled(Split3xTf32Tiling{});
  }
  if constexpr (prefers_deep_tiling<G>()) {
    if (Tiles<DeepTiling, G>::kSmemBytes <= smem) return launch_tiled(DeepTiling{});
  }
  if (Tiles<LargeTiling, G>::kSmemBytes <= smem) return launch_tiled(LargeTiling{});
  launch_tiled(SmallTiling{});
}

void tensor_core(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) {
  MM_VARIANTS_DISPATCH_CUDA_DTYPES(a.scalar_type(), "mm_variants_cuda_tensor_core", [&] {
    with_gemm<scalar_t>(a, b, out, [&](auto g) { launch(g); });
  });
}

// linear's epilogue, fused for the nn.Linear layout only (x row-major, w.t() column-major: both
// K-contiguous), which keeps it at five instantiations per dtype and tiling. The other layouts run
// the plain kernel and take the epilogue from ATen.
void tensor_core_fused(const at::Tensor& a, const at::Tensor& b, const Epilogue& epilogue,
                       at::Tensor& out) {
  MM_VARIANTS_DISPATCH_CUDA_DTYPES(a.scalar_type(), "mm_variants_cuda_tensor_core_fused", [&] {
    with_gemm<scalar_t>(a, b, out, [&](auto g) {
      using G = decltype(g);
      if constexpr (decltype(G::a)::k_contiguous && decltype(G::b)::k_contiguous) {
        with_epilogue<scalar_t>(epilogue, [&](auto epi) { launch(g, epi); });
      } else {
        launch(g);
        apply_epilogue(epilogue, out);
      }
    });
  });
}

// A batch operand whose entries with_gemm reads in place: entries that are neither row- nor
// column-major are copied, the whole batch at once.
at::Tensor entries_in_place(const at::Tensor& t) {
  const at::Tensor first = t.select(0, 0);
  return is_row_major(first) || is_col_major(first) ? t : t.contiguous();
}

void tensor_core_batched(const at::Tensor& a_in, const at::Tensor& b_in, at::Tensor& out) {
  const bool shared_b = b_in.dim() == 2;
  const at::Tensor a = entries_in_place(a_in), b = shared_b ? b_in : entries_in_place(b_in);
  const int64_t batch = a.size(0), m = a.size(1), n = b.size(-1);
  at::Tensor first_out = out.select(0, 0).narrow(0, 0, m * n).view({m, n});
  const BatchStrides strides{a.stride(0), shared_b ? 0 : b.stride(0), out.stride(0)};
  constexpr int64_t kMaxEntries = 65535;  // gridDim.y's limit: larger batches take more launches
  MM_VARIANTS_DISPATCH_CUDA_DTYPES(a.scalar_type(), "mm_variants_cuda_tensor_core_batched", [&] {
    with_gemm<scalar_t>(a.select(0, 0), shared_b ? b : b.select(0, 0), first_out, [&](auto g) {
      for (int64_t first = 0; first < batch; first += kMaxEntries) {
        const auto entries = static_cast<unsigned>(std::min(batch - first, kMaxEntries));
        launch(strides.at(g, first), NoEpilogue{}, strides, entries);
      }
    });
  });
}

MM_VARIANTS_REGISTER({"tensor_core", c10::kCUDA, 8, cuda_dtypes(), &tensor_core, &sm80_or_newer,
                      nullptr, "", /*auto_candidate=*/true, &tensor_core_fused,
                      &tensor_core_batched});

}  // namespace
}  // namespace mm_variants::cuda
