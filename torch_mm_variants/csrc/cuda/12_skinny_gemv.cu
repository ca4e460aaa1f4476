// Rung 12, skinny_gemv: out = x @ w for one to eight tokens on the CUDA cores, the weight read in
// place whether it is an nn.Linear weight [N, K] (x @ w.t(), K-contiguous) or stored [K, N] row by
// row (x @ w, N-contiguous).
//
// Rungs 10 and 11 give the decode product to the tensor cores. At a token or two that costs more
// than it saves: an MMA of 8 token columns uses one, and float32 runs in 3xTF32, every weight word
// split in two and multiplied three times, so rung 10 streamed float32 weights of 4-16 MB at
// 1.5 TB/s where cuBLAS's gemv, a CUDA-core kernel, streamed 2 TB/s (H100). Here each weight
// element meets each token in one float32 FMA: M FMAs per element, which the CUDA cores issue
// faster than memory delivers the weight up to 8 tokens, and float32 products as exact as
// torch.mm's. What is left is streaming the weight:
// - K-contiguous weight: a group of warps owns kRowsPerBlock weight rows and splits K in
//   interleaved steps. In a step a lane loads 16-byte vectors of every row and the x vectors of
//   the same k before it uses any, so each SM keeps tens of KB in flight; a warp's load of a row
//   is 512 contiguous bytes. A block's 8 warps form groups of 1 to 8, as many warps to a group
//   as bring the grid nearest one wave of the warps the SMs hold (k_warps_for).
// - K-contiguous rows of at most 32 16-byte vectors (q @ k^T at a head size of 128): a group's
//   step would leave most lanes idle, so 8 to 32 lanes share a row, a vector each, and a warp
//   load takes whole rows (short_k_kernel, where short_k_takes).
// - N-contiguous weight: a block owns 128 bytes of columns of each weight row (32 floats, 64
//   16-bit elements: one 128-byte line where the rows are so aligned). A warp's load takes them
//   from 4 rows, 4 apart (8 lanes a row); a lane loads 4 consecutive rows per step (so one vector
//   load of x serves them), and the warps split K. Lanes sum x[m][k] * w[k][n] into their 4 or 8
//   columns. Blocks have 8 warps, or at one or two tokens up to 32, as many as let every line's
//   block run at once: more bytes in flight, and no K split where lines (a batch's entries' all
//   together) are at least half the SMs.
// - The lanes' sums meet by shuffles within a warp and in shared memory across warps, always in
//   the same order. Where N gives fewer blocks than SMs, blocks split K as in rung 10, and a
//   second pass adds the splits in order (k_splits): no atomics, the same bits on every run.
// - Weight rows not 16-byte aligned are read element by element. x is copied into aligned rows
//   where it is not (it is small); the weight streams past L1, x stays cached.
// - A bmm batch runs in one launch, its entries the grid's third dimension (skinny_gemv_batched).
#include "common.cuh"
#include "k_splits.cuh"
#include "launch.cuh"
#include "skinny.cuh"

#include <ATen/ops/empty.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <utility>

namespace mm_variants::cuda {
namespace {

using skinny::load_elements;
using skinny::load_row;
using skinny::Problem;
using skinny::word;

constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;
constexpr int kMaxTokens = 8;  // of a kernel
constexpr int kMaxRows = 2 * kMaxTokens;  // of a product: two launches past kMaxTokens
// K-contiguous: the weight rows of a block.
constexpr int kRowsPerBlock = 4;
// N-contiguous: the lanes that share a 128-byte line of a weight row, the rows of one warp load,
// and the consecutive rows a lane loads per step.
constexpr int kLanesPerRow = 8;
constexpr int kRowsPerLoad = 32 / kLanesPerRow;
// 8 or 16 rows a lane ran up to 11% faster on some float32 products and up to 24% slower on
// others (H100, row-major weights of 1024 x 1024 to 14336 x 4096 at 1-8 tokens).
constexpr int kRowsPerLane = 4;  // a multiple of 4: x is loaded 4 k at a time
// The k rows of a step of an N-contiguous block of WARPS warps.
template <int WARPS>
constexpr int kNMajorStep = WARPS * kRowsPerLoad * kRowsPerLane;

template <typename T>
constexpr int kVec = 16 / static_cast<int>(sizeof(T));

// K-contiguous: the 16-byte vectors of each weight row that a lane loads per step. Its loads in
// flight, weight and x, stay near 16 vectors (64 registers), fewer per row as tokens add x's.
template <int TOKENS>
constexpr int kVectorsPerRow = std::max(1, 16 / (kRowsPerBlock + TOKENS));

// Element i of a vector of T held in registers, as a float.
template <typename T, typename V>
__device__ __forceinline__ float element(const V& v, int i) {
  const uint32_t bits = word(v, i * static_cast<int>(sizeof(T)) / 4);
  if constexpr (sizeof(T) == 4) {
    return __uint_as_float(bits);
  } else {
    const uint32_t half = i % 2 == 0 ? bits & 0xffffu : bits >> 16;
    if constexpr (std::is_same_v<T, c10::BFloat16>) return __uint_as_float(half << 16);
    return __half2float(__ushort_as_half(static_cast<unsigned short>(half)));
  }
}

// Four consecutive elements of an x row from p, of which `left` lie inside the block's k range:
// one load where all do (16 bytes of float32, 8 of 16-bit, aligned), else zeros past the end.
template <typename T>
__device__ __forceinline__ auto load_four(const T* p, int64_t left) {
  using Q = std::conditional_t<sizeof(T) == 4, uint4, uint2>;
  if (left >= 4) return *reinterpret_cast<const Q*>(p);
  return load_elements<Q>(p, static_cast<int>(left));  // 1 to 3: the row's k stay inside
}

// The k range of block row blockIdx.y.
template <typename T>
__device__ __forceinline__ void block_k_range(const Problem<T>& p, int64_t& begin,
                                              int64_t& end) {
  begin = blockIdx.y * p.k_per_block;
  end = std::min<int64_t>(p.K, begin + p.k_per_block);
}

// Sum of `value` over the lanes that differ from this one only in lane bits first_bit to
// last_bit (powers of two), in a fixed order: every lane of such a group ends with the same bits.
__device__ __forceinline__ float sum_over_lanes(float value, int first_bit, int last_bit) {
  for (int bit = first_bit; bit <= last_bit; bit <<= 1) {
    value += __shfl_xor_sync(0xffffffffu, value, bit);
  }
  return value;
}

// Adds the WARPS partial sums of output (m, n), rows of `sums` from the first, in warp order and
// stores it (skinny::store_sum).
template <int WARPS, typename T, int SUMS>
__device__ __forceinline__ void add_and_store(const Problem<T>& p, const float (*sums)[SUMS],
                                              int index, int m, int n) {
  if (m >= p.M || n >= p.N) return;
  float sum = 0.0f;
#pragma unroll
  for (int w = 0; w < WARPS; ++w) sum += sums[w][index];
  skinny::store_sum(p, m, n, sum);
}

// K-contiguous weight: the block's warps form groups of K_WARPS (k_warps_for), group g of block
// bx computing out[:, R (G bx + g) : R (G bx + g + 1)] over the block's k range (R =
// kRowsPerBlock, G = kWarps / K_WARPS groups), its warps splitting that range in interleaved
// steps. A split's k range is whole warp steps, not whole group steps, so some warps may take one
// step more than others (rung 10 splits the same way).
// W_VECTOR: w's pointer and leading dimension are 16-byte aligned. BATCHED: entry blockIdx.z of a
// batch (a kernel of its own: the offsets cost a single product's kernels up to a block per SM).
// float32's batched kernels are held to two blocks an SM (128 registers, no spills), as its single
// products' are without a bound: unbounded, the batched one at 4 tokens took 146 registers, one
// block an SM, and ran 8 entries against 4096 x 14336 weights in 1.3 times the time of 8 single
// products (H200). 0 leaves a kernel unbounded, and the single products' code as it was.
template <typename T, bool BATCHED>
constexpr int kMinKMajorBlocks = BATCHED && sizeof(T) == 4 ? 2 : 0;

template <typename T, int TOKENS, bool W_VECTOR, bool BATCHED = false, int K_WARPS = kWarps>
__global__ void __launch_bounds__(kThreads, (kMinKMajorBlocks<T, BATCHED>))
    k_major_kernel(Problem<T> p) {
  static_assert(kWarps % K_WARPS == 0, "the block's warps form whole groups");
  if constexpr (BATCHED) p = skinny::entry_of_batch(p);
  constexpr int V = kVec<T>, U = kVectorsPerRow<TOKENS>;
  constexpr int kStep = 32 * V * U;  // k of a warp's step
  constexpr int kGroups = kWarps / K_WARPS;  // groups of K_WARPS warps, each its own rows
  constexpr int kSums = kRowsPerBlock * TOKENS;  // of a group
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int first_row = blockIdx.x * kGroups * kRowsPerBlock;  // the block's
  const int n0 = first_row + warp / K_WARPS * kRowsPerBlock;
  int64_t k_begin, k_end;
  block_k_range(p, k_begin, k_end);
  // Rows past N and tokens past M read the last valid one, and feed sums never stored.
  const T* w_row[kRowsPerBlock];
#pragma unroll
  for (int r = 0; r < kRowsPerBlock; ++r) w_row[r] = p.w + std::min(n0 + r, p.N - 1) * p.ldw;
  const T* x_row[TOKENS];
#pragma unroll
  for (int m = 0; m < TOKENS; ++m) x_row[m] = p.x + std::min(m, p.M - 1) * p.ldx;

  float acc[kRowsPerBlock][TOKENS] = {};
  for (int64_t base = k_begin + warp % K_WARPS * kStep; base < k_end; base += K_WARPS * kStep) {
    uint4 wv[U][kRowsPerBlock], xv[U][TOKENS];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t k = base + (u * 32 + lane) * V;
      const int left = static_cast<int>(std::min<int64_t>(k_end - k, V));  // past k_end: zeros
#pragma unroll
      for (int r = 0; r < kRowsPerBlock; ++r) {
        wv[u][r] = load_row<W_VECTOR, true>(w_row[r] + k, left);
      }
#pragma unroll
      for (int m = 0; m < TOKENS; ++m) xv[u][m] = load_row<true, false>(x_row[m] + k, left);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
#pragma unroll
      for (int m = 0; m < TOKENS; ++m) {
        float xf[V];
#pragma unroll
        for (int i = 0; i < V; ++i) xf[i] = element<T>(xv[u][m], i);
#pragma unroll
        for (int r = 0; r < kRowsPerBlock; ++r) {
#pragma unroll
          for (int i = 0; i < V; ++i) acc[r][m] = fmaf(element<T>(wv[u][r], i), xf[i], acc[r][m]);
        }
      }
    }
  }

  __shared__ float sums[kWarps][kSums];
#pragma unroll
  for (int r = 0; r < kRowsPerBlock; ++r) {
#pragma unroll
    for (int m = 0; m < TOKENS; ++m) {
      const float sum = sum_over_lanes(acc[r][m], 1, 16);
      if (lane == 0) sums[warp][r * TOKENS + m] = sum;
    }
  }
  __syncthreads();
  // Thread e adds sum i of group g over the group's warps, in warp order.
  const int e = threadIdx.x, g = e / kSums, i = e % kSums;
  if (g < kGroups) {
    add_and_store<K_WARPS>(p, &sums[g * K_WARPS], i, i % TOKENS,
                           first_row + g * kRowsPerBlock + i / TOKENS);
  }
}

// K-contiguous weight whose rows are at most ROW_LANES 16-byte vectors (q @ k^T at a head size
// of 128, a LoRA's rank): ROW_LANES lanes share a row, a vector each, so that one warp load takes
// 32 / ROW_LANES whole rows, and a lane loads kShortRows such rows before using any. k_major_kernel
// would leave lanes idle there: its step at one token is 3 vectors a lane of 4 rows, 768 16-bit k.
// A row's sums meet by shuffles among its lanes: no shared memory, no K split. Up to 4 tokens, or 8
// on rows of at most 64 elements (short_k_takes); fewer rows a lane as tokens hold more registers.
template <int TOKENS>
constexpr int kShortRows = TOKENS == 1 ? 12 : TOKENS <= 4 ? 8 : 4;

template <typename T, int TOKENS, bool W_VECTOR, bool BATCHED, int ROW_LANES>
__global__ void __launch_bounds__(kThreads, 2) short_k_kernel(Problem<T> p) {
  if constexpr (BATCHED) p = skinny::entry_of_batch(p);
  constexpr int V = kVec<T>, R = kShortRows<TOKENS>, S = 32 / ROW_LANES;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int slot = lane / ROW_LANES;  // of the warp load's S rows
  const int k = lane % ROW_LANES * V;
  const int left = std::min(p.K - k, V);  // 0 or less past K: zeros, nothing read
  const int64_t first_row = (static_cast<int64_t>(blockIdx.x) * kWarps + warp) * R * S + slot;
  uint4 xv[TOKENS], wv[R];
#pragma unroll
  for (int m = 0; m < TOKENS; ++m) {
    xv[m] = load_row<true, false>(p.x + std::min(m, p.M - 1) * p.ldx + k, left);
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int64_t n = std::min<int64_t>(first_row + r * S, p.N - 1);
    wv[r] = load_row<W_VECTOR, true>(p.w + n * p.ldw + k, left);
  }
  float acc[R][TOKENS] = {};
#pragma unroll
  for (int m = 0; m < TOKENS; ++m) {
    float xf[V];
#pragma unroll
    for (int i = 0; i < V; ++i) xf[i] = element<T>(xv[m], i);
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
      for (int i = 0; i < V; ++i) acc[r][m] = fmaf(element<T>(wv[r], i), xf[i], acc[r][m]);
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int64_t n = first_row + r * S;
#pragma unroll
    for (int m = 0; m < TOKENS; ++m) {
      const float sum = sum_over_lanes(acc[r][m], 1, ROW_LANES / 2);
      if (lane % ROW_LANES == 0 && m < p.M && n < p.N) skinny::store_sum(p, m, n, sum);
    }
  }
}

// N-contiguous weight: block blockIdx.x computes out[:, C bx : C bx + C] over its k range, C the
// elements of a 128-byte line, its WARPS warps splitting it. W_VECTOR: w's pointer and leading
// dimension are 16-byte aligned. BATCHED as for k_major_kernel.
template <typename T, int TOKENS, bool W_VECTOR, int WARPS, bool BATCHED = false>
__global__ void __launch_bounds__(32 * WARPS) n_major_kernel(Problem<T> p) {
  if constexpr (BATCHED) p = skinny::entry_of_batch(p);
  constexpr int V = kVec<T>;
  constexpr int kColumns = kLanesPerRow * V;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int column = lane % kLanesPerRow;  // lanes 8 apart share a column and sum together
  const int n0 = blockIdx.x * kColumns, n = n0 + column * V;
  const int left_n = p.N - n;  // columns past N read as zeros
  int64_t k_begin, k_end;
  block_k_range(p, k_begin, k_end);
  const T* x_row[TOKENS];
#pragma unroll
  for (int m = 0; m < TOKENS; ++m) x_row[m] = p.x + std::min(m, p.M - 1) * p.ldx;

  float acc[TOKENS][V] = {};
  const int first_row = (warp * kRowsPerLoad + lane / kLanesPerRow) * kRowsPerLane;
  for (int64_t k = k_begin + first_row; k < k_end; k += kNMajorStep<WARPS>) {
    uint4 wv[kRowsPerLane];
#pragma unroll
    for (int j = 0; j < kRowsPerLane; ++j) {
      wv[j] = k + j < k_end ? load_row<W_VECTOR, true>(p.w + (k + j) * p.ldw + n, left_n)
                            : make_uint4(0, 0, 0, 0);
    }
    decltype(load_four(p.x, 0)) xv[TOKENS][kRowsPerLane / 4];
#pragma unroll
    for (int m = 0; m < TOKENS; ++m) {
#pragma unroll
      for (int q = 0; q < kRowsPerLane / 4; ++q) {
        xv[m][q] = load_four(x_row[m] + k + 4 * q, k_end - k - 4 * q);
      }
    }
#pragma unroll
    for (int j = 0; j < kRowsPerLane; ++j) {
      float wf[V];
#pragma unroll
      for (int i = 0; i < V; ++i) wf[i] = element<T>(wv[j], i);
#pragma unroll
      for (int m = 0; m < TOKENS; ++m) {
        const float xk = element<T>(xv[m][j / 4], j % 4);
#pragma unroll
        for (int i = 0; i < V; ++i) acc[m][i] = fmaf(wf[i], xk, acc[m][i]);
      }
    }
  }

  __shared__ float sums[WARPS][TOKENS * kColumns];
#pragma unroll
  for (int m = 0; m < TOKENS; ++m) {
#pragma unroll
    for (int i = 0; i < V; ++i) {
      const float sum = sum_over_lanes(acc[m][i], kLanesPerRow, 16);
      if (lane < kLanesPerRow) sums[warp][m * kColumns + column * V + i] = sum;
    }
  }
  __syncthreads();
  for (int e = threadIdx.x; e < TOKENS * kColumns; e += 32 * WARPS) {
    add_and_store<WARPS>(p, sums, e, e / kColumns, n0 + e % kColumns);
  }
}

// The warps that split each kRowsPerBlock rows' k range (k_major_kernel's K_WARPS): a power of
// two up to kWarps and no more than K has warp steps for, the one that brings the grid's warps
// nearest, by ratio, to one wave of 16 an SM (the two blocks of 8 warps that float32's registers
// let an SM hold). Fewer leave the SMs short of loads in flight; more run the grid in waves, each
// warp taking fewer steps, so that its start, its last partial step and the adds across warps
// weigh more. In CUDA graphs, weights rotated past L2 (H200), against the rule before it (8
// warps, or 1 for a K of at most 8 steps on 3/4 of the SMs' worth of 32-row blocks):
// - float32 at 1-4 tokens: 4096 x 512 (2 warps) 1.09-1.42x as fast, 4096 x 1024 (2) 1.27-1.31x,
//   3072 x 1024 (2) 1.30-1.34x, 2048 x 1024 (4) 1.21-1.25x, 4096 x 4096 (2) 1.04-1.15x;
//   14336 x 4096 (1) and 4096 x 14336 (2) 0.94-1.04x;
// - bf16 at 1-4 tokens, 4096 x 4096 (2, was 1): 1.17-1.24x;
// - 1024 x 4096 (8), 8192 x 1024 and 14336 x 512 (1), batches of 8 x 1024 and 32 x 1024 rows
//   (1): unchanged, and the other counts slower there.
inline int k_warps_for(int64_t K, int warp_step, int64_t N, const skinny::Batch& batch) {
  const int sms = device_properties(c10::cuda::current_device()).multiProcessorCount;
  const int64_t wave = 2 * kWarps * int64_t{sms};  // two blocks an SM
  const int64_t row_groups = ceil_div(N, int64_t{kRowsPerBlock}) * batch.entries;
  const int64_t steps = ceil_div(K, int64_t{warp_step});
  int k_warps = 1;
  while (k_warps < kWarps && k_warps < steps) {
    const int64_t warps = row_groups * k_warps;  // the grid's
    // Twice as many are nearer the wave by ratio where wave / warps > 2 warps / wave.
    if (warps >= wave || 2 * warps * warps >= wave * wave) break;
    k_warps *= 2;
  }
  return k_warps;
}

// skinny::dispatch_power_of_two takes the kernels' token counts (kMaxTokens) and warps to a row
// group (kWarps).
static_assert(kMaxTokens == 8 && kWarps == 8);
using skinny::dispatch_power_of_two;

// Where short_k_kernel takes a K-contiguous product of M tokens over `rows` weight rows (N, times
// a batch's entries): rows of at most 32 16-byte vectors, M <= 4 (or 8 on rows of at most 64
// elements), and 48 rows per SM or more. In
// CUDA graphs, weights rotated past L2 (H200), against the kernel `auto` ran before (rung 10 for
// 16 bits, k_major_kernel for float32), as fractions of torch.bmm / torch.mm's speed (16-bit
// products have since gone to rung 10's short_rows_kernel under `auto`, see lower_rung_is_faster):
// - q @ k^T batches, bf16, at 1 / 4 tokens: 32 x [1024, 128] 1.07x / 0.79x (rung 10 0.54x /
//   0.54x), 32 x [4096, 128] 1.03x / 0.74x (0.45x / 0.44x), 128 x [4096, 128] 1.01x / 0.66x
//   (0.34x / 0.35x), 32 x [4096, 64] 1.19x / 0.92x (0.26x / 0.27x), 8 x [1024, 256] 1.19x / 0.93x
//   (0.89x / 0.89x); float32, 32 x [4096, 128] 1.27x / 2.17x (1.03x / 1.73x), 128 x [4096, 128]
//   1.39x / 1.96x (1.06x / 1.44x), 32 x [4096, 64] 1.52x / 2.45x (0.71x / 1.00x).
// - Single products at 1-4 tokens: bf16 16384 x 128 0.98-1.24x (0.72-0.73x), 14336 x 200
//   0.77-1.06x (0.74-0.75x); float32 16384 x 128 1.23-1.46x (1.12-1.34x).
// - 8 tokens on rows of 64 elements (4 rows a lane): fp16 16384 x 64 0.82x (rung 10 0.61x),
//   32 x [4096, 64] 0.43x (0.20x); float32 16384 x 64 1.25x (0.78x), 32 x [4096, 64] 1.29x (0.76x).
// Not taken: 5-8 tokens on longer rows (more lanes a row, so more shuffles to sum each), behind
// rung 10 (bf16 14336 x 200 0.42x against 0.72x, 16384 x 128 level; float32 32 x [1024, 128]
// 0.86x against 0.91x); fewer rows, where a block's 96-192 rows leave SMs idle (float32 1024 x 128
// at one token 1.05x against 1.20x, 4096 x 128 at 4 tokens 1.12x against 1.24x; bf16 1024 x 128
// 1.17x against rung 10's 1.34x, 4096 x 128 level with it).
inline bool short_k_takes(int64_t K, int64_t vector, int64_t M, int64_t rows, int64_t sms) {
  const bool tokens_fit = M <= 4 || (M <= 8 && K <= 64);
  return K <= 32 * vector && tokens_fit && rows >= 48 * sms;
}

// K-contiguous rows of at most 32 16-byte vectors: short_k_kernel, 8, 16 or 32 lanes to a row.
template <typename T, int TOKENS>
void launch_short_k(const skinny::Rows& x, const skinny::Rows& w, at::Tensor& out,
                    const skinny::Batch& batch) {
  const int64_t vectors = ceil_div(x.data.size(1), int64_t{kVec<T>});  // of a row
  const int row_lanes = vectors <= 8 ? 8 : vectors <= 16 ? 16 : 32;
  const int64_t rows_per_block = int64_t{kWarps} * kShortRows<TOKENS> * (32 / row_lanes);
  const skinny::SplitProduct<T> product(x, w, out, KSplit{1, x.data.size(1)}, batch);
  const KernelLaunch launch(skinny::grid_of(ceil_div(out.size(1), rows_per_block), 1, batch),
                            kThreads, 0);
  const auto run = [&](auto row_lanes_c) {
    dispatch_bools(
        [&](auto w_vector_c, auto batched_c) {
          launch.run(short_k_kernel<T, TOKENS, decltype(w_vector_c)::value,
                                    decltype(batched_c)::value, decltype(row_lanes_c)::value>,
                     product.problem());
        },
        skinny::rows_aligned<T>(w.data.data_ptr(), w.ld, batch), batch.entries > 1);
  };
  if (row_lanes == 8) return run(std::integral_constant<int, 8>{});
  if (row_lanes == 16) return run(std::integral_constant<int, 16>{});
  run(std::integral_constant<int, 32>{});
}

// K-contiguous weight: short_k_kernel where short_k_takes, else blocks of kRowsPerBlock rows per
// group of warps, splitting K where they are fewer than SMs, then the pass that adds the splits.
template <typename T, int TOKENS>
void launch_k_major(const skinny::Rows& x, const skinny::Rows& w, at::Tensor& out,
                    const skinny::Batch& batch) {
  constexpr int kStep = 32 * kVec<T> * kVectorsPerRow<TOKENS>;  // a warp's
  const int64_t K = x.data.size(1);
  const int sms = device_properties(c10::cuda::current_device()).multiProcessorCount;
  if (short_k_takes(K, kVec<T>, TOKENS, out.size(1) * batch.entries, sms)) {
    return launch_short_k<T, TOKENS>(x, w, out, batch);
  }
  const int k_warps = k_warps_for(K, kStep, out.size(1), batch);
  const int64_t blocks = ceil_div(out.size(1), kRowsPerBlock * (kWarps / k_warps));
  const skinny::SplitProduct<T> product(
      x, w, out, skinny::split_for(batch, blocks, K, kStep, int64_t{kStep} * k_warps), batch);
  const KernelLaunch launch(skinny::grid_of(blocks, product.splits(), batch), kThreads, 0);
  dispatch_power_of_two(k_warps, [&](auto k_warps_c) {
    dispatch_bools(
        [&](auto w_vector_c, auto batched_c) {
          launch.run(k_major_kernel<T, TOKENS, decltype(w_vector_c)::value,
                                    decltype(batched_c)::value, decltype(k_warps_c)::value>,
                     product.problem());
        },
        skinny::rows_aligned<T>(w.data.data_ptr(), w.ld, batch), batch.entries > 1);
  });
  product.add_splits();
}

// N-contiguous weight, rows 16-byte aligned or not (W_VECTOR): blocks of WARPS warps, one per
// 128-byte line of columns, splitting K where they would leave SMs idle (a block of 16 or 32
// warps counts as 2 or 4 of 8 in split_k's rule), then the pass that adds the splits.
template <typename T, int TOKENS, bool W_VECTOR, int WARPS, bool BATCHED>
void launch_n_major_blocks(const skinny::Rows& x, const skinny::Rows& w, at::Tensor& out,
                           int64_t lines, const skinny::Batch& batch) {
  constexpr int kStep = kNMajorStep<WARPS>;
  const skinny::SplitProduct<T> product(
      x, w, out, skinny::split_for(batch, lines * WARPS / kWarps, x.data.size(1), kStep, kStep),
      batch);
  KernelLaunch(skinny::grid_of(lines, product.splits(), batch), 32 * WARPS, 0)
      .run(n_major_kernel<T, TOKENS, W_VECTOR, WARPS, BATCHED>, product.problem());
  product.add_splits();
}

// Whether the blocks of WARPS warps, one per line, all fit on the SMs at once.
template <typename T, int TOKENS, bool W_VECTOR, int WARPS, bool BATCHED>
bool lines_fit_one_wave(int64_t lines, int sms) {
  const int per_sm = resident_blocks_per_sm(n_major_kernel<T, TOKENS, W_VECTOR, WARPS, BATCHED>,
                                            32 * WARPS, 0);
  return lines <= static_cast<int64_t>(per_sm) * sms;
}

// N-contiguous weight. The weight streams at the rate of the loads in flight, 64 bytes a lane per
// step. At one or two tokens, where there are at least half as many 128-byte lines as SMs, blocks
// take 32 or 16 warps, the most with which every line's block runs at once (one or two an SM): more
// bytes in flight than 8 warps, and no K split, so no adding pass. Float32 on an H200, K = 4096 (in
// a CUDA graph / L2 cleared before each call), against blocks of 8 warps: 4096 columns (128 lines,
// 32 warps, where 8 split K in two) ran 1.11x / 1.10x as fast, 5120 and 6144 (16 warps) 1.17-1.27x
// / 1.11-1.17x, 8192 1.04-1.05x, and 4096 x 14336 1.03x / 1.06x; from 11008 columns blocks keep 8
// warps. From 66 to 127 lines (2081-4064 columns) 32 warps leave some SMs idle where 8 with a K
// split would fill them, with as many warps or fewer; not measured against 8 there, 2112 and 3072
// columns ran at 1.05-1.30x of torch.mm at one token. Past two tokens blocks of 16 warps ran up to
// 20% slower than 8 (4096 x 14336 at 7-8 tokens), and with fewer lines than half the SMs, where K
// splits either way, up to 3% (2048 x 2048 at 1-2 tokens), so those keep 8. A batch's lines
// count together (its entries fill the SMs together): float32 p @ v at one token (H200, CUDA
// graphs, values rotated past L2) went from 0.72x to 1.05x of torch.bmm's speed on 32 x [4096,
// 128] and 16 x [4096, 256], from 0.96x to 1.24x on 32 x [1024, 128], from 1.03x to 1.10x on
// 64 x [2048, 128], against blocks of 8 warps.
template <typename T, int TOKENS>
void launch_n_major(const skinny::Rows& x, const skinny::Rows& w, at::Tensor& out,
                    const skinny::Batch& batch) {
  const int64_t lines = ceil_div(out.size(1), kLanesPerRow * kVec<T>);  // of an entry
  const int64_t all_lines = lines * batch.entries;
  const int sms = device_properties(c10::cuda::current_device()).multiProcessorCount;
  dispatch_bools(
      [&](auto w_vector_c, auto batched_c) {
        constexpr bool kVector = decltype(w_vector_c)::value, kBatched = decltype(batched_c)::value;
        if constexpr (TOKENS <= 2) {
          if (2 * all_lines >= sms) {
            if (lines_fit_one_wave<T, TOKENS, kVector, 32, kBatched>(all_lines, sms)) {
              return launch_n_major_blocks<T, TOKENS, kVector, 32, kBatched>(x, w, out, lines,
                                                                             batch);
            }
            if (lines_fit_one_wave<T, TOKENS, kVector, 16, kBatched>(all_lines, sms)) {
              return launch_n_major_blocks<T, TOKENS, kVector, 16, kBatched>(x, w, out, lines,
                                                                             batch);
            }
          }
        }
        launch_n_major_blocks<T, TOKENS, kVector, kWarps, kBatched>(x, w, out, lines, batch);
      },
      skinny::rows_aligned<T>(w.data.data_ptr(), w.ld, batch), batch.entries > 1);
}

// The kernels for the tokens of x (M of them, at most kMaxRows), on a weight read N-major or
// K-contiguous; x, w and out are entry 0's of `batch`. Past kMaxTokens the tokens go in groups of
// kMaxTokens, a launch each writing its own rows of out (every entry's out is row-major, N
// apart), the weight streamed once per group: see lower_rung_is_faster for where that leads.
template <typename T>
void launch_gemv(const skinny::Rows& x, const skinny::Rows& w, bool n_major, at::Tensor& out,
                 const skinny::Batch& batch = {}) {
  const int64_t M = x.data.size(0);
  for (int64_t first = 0; first < M; first += kMaxTokens) {
    const int64_t tokens = std::min<int64_t>(kMaxTokens, M - first);
    const skinny::Rows group{x.data.narrow(0, first, tokens), x.ld};
    at::Tensor group_out = out.narrow(0, first, tokens);
    dispatch_power_of_two(tokens, [&](auto tokens_c) {
      constexpr int kTokens = decltype(tokens_c)::value;
      if (n_major) return launch_n_major<T, kTokens>(group, w, group_out, batch);
      launch_k_major<T, kTokens>(group, w, group_out, batch);
    });
  }
}

// A weight stored row by row ([K, N], N-contiguous) is read in place; any other layout of b as
// w = b.t(), K-contiguous, copied so where it is not.
template <typename T>
void skinny_gemv_typed(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) {
  skinny::check_extents(a, b, "skinny_gemv");
  const bool n_major = skinny::row_major(b);
  const skinny::Rows w = skinny::batch_weights(b, n_major).first;
  launch_gemv<T>(skinny::tokens<T>(a), w, n_major, out);
}

// One launch for a batch (grid z), weights read as for a single product (skinny::batch_weights).
template <typename T>
void launch_batch(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) {
  const int64_t M = a.size(1), N = b.size(-1);
  at::Tensor out0 = out.select(0, 0).narrow(0, 0, M * N).view({M, N});
  const auto [x, x_stride] = skinny::batch_tokens<T>(a);
  const bool n_major = skinny::row_major(b.dim() == 2 ? b : b.select(0, 0));
  const auto [w, w_stride] = skinny::batch_weights(b, n_major);
  launch_gemv<T>(x, w, n_major, out0, {a.size(0), x_stride, w_stride, out.stride(0)});
}

void skinny_gemv(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) {
  MM_VARIANTS_DISPATCH_CUDA_DTYPES(a.scalar_type(), "mm_variants_cuda_skinny_gemv",
                                   [&] { skinny_gemv_typed<scalar_t>(a, b, out); });
}

// A whole bmm batch in one launch (run_batched), its entries the grid's third dimension, K split
// only where all their blocks together are fewer than SMs: a batch of a few tokens against each
// entry's own matrix (attention's products at decode) costs one launch, not one per entry, and
// row-major float32 entries are read in place.
void skinny_gemv_batched(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) {
  MM_VARIANTS_DISPATCH_CUDA_DTYPES(a.scalar_type(), "mm_variants_cuda_skinny_gemv_batched", [&] {
    skinny::in_grid_sized_parts(a, b, out, "skinny_gemv", launch_batch<scalar_t>);
  });
}

bool few_tokens(const at::Tensor& a, const at::Tensor&) { return a.size(0) <= kMaxRows; }

constexpr const char* kFewTokensOnly =
    "it is for one to sixteen rows of a (LLM decode of a few sequences) and takes M <= 16; use "
    "another algorithm (or 'auto') for larger M";

// 16-bit nn.Linear weights that this rung streams faster than rungs 10 and 11 at 1-2 tokens: 4 to
// 16 rows per SM (1024-2048 on 132 SMs; grouped-query attention's k and v projections, 1024 x 4096
// in Llama 3 8B) and K of 1024 or more. There 4-8 warps to each 4 rows fill the SMs with no K
// split, where rung 10 splits K and adds the splits in a second pass. In CUDA graphs, weights
// rotated past L2 (H200, bf16 and fp16 alike), against `auto`'s rung before: 1024 rows, K = 1024
// to 14336, 1.04-1.41x as fast (bf16 1024 x 4096: 4.3 against 5.4 us, 1.79x of torch.mm); 2048
// rows, 1.03-1.18x; with L2 cleared before each call (bf16), 0.97-1.24x. Not taken: 512 rows,
// from 1.31x as fast (K = 4096) to 1.17 times slower (14336, split over blocks); 3072 rows and
// more, from 5% faster to 6% slower; K = 512, level; K = 128 (q @ k^T at a head size of 128), up
// to 1.35 times slower (short_k_takes has where this rung's short_k_kernel leads there); 3-4
// tokens, from 1.27x as fast to 9% slower.
// A bmm batch counts its entries' rows together (experts' narrow weights). 16-bit batches of
// 4-32 entries at 1-2 tokens against rung 10 with its batch K split, same timing (H200): 1024
// and 2048 rows 1.05-1.22x as fast at K = 4096 and 14336, level (0.98-1.05x) at 1024; 512 rows
// 1.26-1.32x as fast at K = 4096 but 1.16-1.20 times slower at 14336; 4096 and 8192 rows level
// at K = 4096, 1.04-1.07x as fast at 14336 and up to 1.14 times slower at 1024.
bool narrow_16bit_weight(const at::Tensor& a, const at::Tensor& b, int64_t entries) {
  const int64_t sms = device_info_for(a.device())->multiProcessorCount;
  const int64_t rows = b.size(1) * entries;
  return !skinny::row_major(b) && a.size(0) <= 2 && b.size(0) >= 1024 && rows >= 4 * sms &&
         rows <= 16 * sms;
}

// Where `auto` passes this rung over for the rungs below it. Back to back in a CUDA graph
// (weights rotated past L2; N x K of 1024 x 1024, 4096 x 4096, 14336 x 4096 and 4096 x 14336;
// decode.md has the tables):
// - float32 at 1-4 tokens ran faster here than on rungs 10 and 11 (H100; K-contiguous: 1.06-2.02x
//   of torch.mm, where rung 10 ran at 0.72-1.33x; row-major: 0.93-2.51x, rung 11 0.85-2.29x), but
//   on row-major weights of more than 4096 output columns (N) at 4 tokens (N = 14336: 86.1
//   against rung 11's 83.6 us).
// - float32 at 5-8 tokens: on K-contiguous weights rung 10 was the faster on the three larger
//   ones (H200: 19.3-19.6 against 26.7-27.2 us on 4096 x 4096). On row-major weights this rung
//   was the faster up to 4096 columns (H200: 23.6-24.0 against rung 11's 27.1-27.5 us on
//   4096 x 4096, 69.0-69.5 against 86.7-87.8 on 4096 x 14336, and ahead on 1024 x 1024), rung 11
//   on 14336 columns (69.1-71.5 against 73.3-74.2). So row-major weights of up to 4096 columns
//   stay here up to 8 tokens, wider ones up to 2.
// - float32 row-major weights that rung 11 does not read in place (no sm_90a, or rows TMA cannot
//   address) the rungs below copy K-contiguous or, from 1024 x 4096 elements, pass to rung 8,
//   whose time has a floor of a 128-row tile's pass over K: rows one element off alignment took
//   9.1-120 us here at 1-8 tokens (element by element) and 82-575 us on rung 8, 1024 x 1024 to
//   14336 x 4096 (L2 cleared before each call). This rung takes those up to 8 tokens.
// - 16 bits: at one token this rung ran from 3% faster to 16% slower than rungs 10 and 11 on
//   the Llama weights, and from 4 tokens slower everywhere: its K-contiguous kernel then holds
//   166 registers or more, one block per SM. See narrow_16bit_weight for where it leads. Rows
//   that short_k_takes go to rung 10's short_rows_kernel, which was never slower than
//   short_k_kernel and up to 7.4 times as fast (at 8 tokens; H200, 96 cases, 10_skinny.cu).
// - float32 products that short_k_takes stay here, at any token count it allows (on `entries`
//   products in one launch: a bmm batch, a and b one entry each), but bmm batches of entries that
//   rung 11 reads in place from 5 tokens on (q @ k^T): its batched kernel ran 32 x [1024 or 4096,
//   64 or 128] keys at 6-8 tokens at 1.50-2.31x of torch.bmm, this rung's short-K kernel at
//   1.08-1.40x (CUDA graphs, keys rotated past L2, H200); at 3-4 tokens both 1.41-2.47x.
// - 9-16 tokens (a launch for each group of 8, the weight streamed twice): float32 row-major
//   weights that rung 11 does not read in place, as up to 8 tokens. Rows one element in ran at
//   0.62-1.27x of torch.mm at 12-16 tokens on 1024 x 1024 to 4096 x 4096, where rung 8 ran at
//   0.10-0.52x and rung 10 at 0.26-0.51x. Batches of row-major entries it reads (p @ v) go to
//   rung 11's batched kernel: at 16 tokens, same timing, 2.04-7.52x of torch.bmm on 32 x [1024 or
//   4096, 64 or 128] values and 2.15-3.75x on 8 x [4096, 1024] and 4 x [4096, 4096], where this
//   rung ran 1.01-3.52x and 1.07-1.85x. Single products stay on rung 11 too, 1.1-1.9 times as
//   fast as this rung on 256 to 4096 columns, K = 1024 and 4096 (H100). 16-bit values stay on the
//   rungs below (rung 10 2.5-3.9 times as fast as this rung on them), and nn.Linear weights past 8
//   tokens (float32 q @ k^T over 32 x [4096, 128] keys: 0.68-0.87x here, 1.01-1.05x on rung 10).
bool lower_rung_is_faster(const at::Tensor& a, const at::Tensor& b, int64_t entries) {
  if (a.scalar_type() != at::kFloat) return !narrow_16bit_weight(a, b, entries);
  const bool row_major = skinny::row_major(b), tma = sm90a(a.device());
  if (entries > 1 && a.size(0) > 4 && tma && skinny::tma_reads_k_major(a, b)) return true;
  const int64_t sms = device_info_for(a.device())->multiProcessorCount;
  const int64_t vector = 16 / a.element_size(), rows = b.size(1) * entries;
  if (!row_major && short_k_takes(b.size(0), vector, a.size(0), rows, sms)) return false;
  if (row_major && !(tma && skinny::tma_reads_n_major(a, b))) return false;
  if (a.size(0) > kMaxTokens) return true;
  if (a.size(0) <= 2) return false;
  return row_major ? b.size(1) > 4096 : a.size(0) > 4;
}

// The weight's streaming load asks L2 for 256 bytes, an sm_80 qualifier.
MM_VARIANTS_REGISTER({"skinny_gemv", c10::kCUDA, 12, cuda_dtypes(), &skinny_gemv, &sm80_or_newer,
                      &few_tokens, kFewTokensOnly, /*auto_candidate=*/true,
                      /*run_fused=*/nullptr, &skinny_gemv_batched, &lower_rung_is_faster});

}  // namespace
}  // namespace mm_variants::cuda
