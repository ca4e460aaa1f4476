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
// - K-contiguous weight: a block owns kRowsPerBlock weight rows and its warps split K in
//   interleaved steps. In a step a lane loads 16-byte vectors of every row and the x vectors of
//   the same k before it uses any, so each SM keeps tens of KB in flight; a warp's load of a row
//   is 512 contiguous bytes.
// - N-contiguous weight: a block owns 128 bytes of columns of each weight row (32 floats, 64
//   16-bit elements: one 128-byte line where the rows are so aligned). A warp's load takes them
//   from 4 rows, 4 apart (8 lanes a row); a lane loads 4 consecutive rows per step (so one vector
//   load of x serves them), and the warps split K. Lanes sum x[m][k] * w[k][n] into their 4 or 8
//   columns.
// - The lanes' sums meet by shuffles within a warp and in shared memory across warps, always in
//   the same order. Where N gives fewer blocks than SMs, blocks split K as in rung 10, and a
//   second pass adds the splits in order (k_splits): no atomics, the same bits on every run.
// - Weight rows not 16-byte aligned are read element by element. x is copied into aligned rows
//   where it is not (it is small); the weight streams past L1, x stays cached.
#include "common.cuh"
#include "k_splits.cuh"
#include "launch.cuh"
#include "skinny.cuh"

#include <ATen/ops/empty.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace mm_variants::cuda {
namespace {

using skinny::load_row;
using skinny::load_streaming;
using skinny::word;

constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;
constexpr int kMaxTokens = 8;
constexpr int kMaxSplits = 16;
// K-contiguous: the weight rows of a block.
constexpr int kRowsPerBlock = 4;
// N-contiguous: the lanes that share a 128-byte line of a weight row, the rows of one warp load,
// and the consecutive rows a lane loads per step.
constexpr int kLanesPerRow = 8;
constexpr int kRowsPerLoad = 32 / kLanesPerRow;
// 8 or 16 rows a lane ran up to 11% faster on some float32 products and up to 24% slower on
// others (H100, row-major weights of 1024 x 1024 to 14336 x 4096 at 1-8 tokens).
constexpr int kRowsPerLane = 4;  // a multiple of 4: x is loaded 4 k at a time
constexpr int kNMajorStep = kWarps * kRowsPerLoad * kRowsPerLane;  // k rows of a block's step

template <typename T>
constexpr int kVec = 16 / static_cast<int>(sizeof(T));

// K-contiguous: the 16-byte vectors of each weight row that a lane loads per step. Its loads in
// flight, weight and x, stay near 16 vectors (64 registers), fewer per row as tokens add x's.
template <int TOKENS>
constexpr int kVectorsPerRow = std::max(1, 16 / (kRowsPerBlock + TOKENS));

template <typename T>
struct GemvProblem {
  const T* w;  // K-contiguous: w[n][k] at w[n * ldw + k]; N-contiguous: w[k][n] at w[k * ldw + n]
  int64_t ldw;
  const T* x;  // x[m][k] at x[m * ldx + k]; rows 16-byte aligned
  int64_t ldx;
  T* out;          // [M][N], contiguous
  float* partial;  // [gridDim.y][M][N] when blocks split K, else null
  int M, N, K;
  int64_t k_per_block;
};

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
  Vec<T, 4> v;
#pragma unroll
  for (int e = 0; e < 4; ++e) v.v[e] = e < left ? p[e] : T(0);
  return *reinterpret_cast<const Q*>(&v);
}

// The k range of block row blockIdx.y.
template <typename T>
__device__ __forceinline__ void block_k_range(const GemvProblem<T>& p, int64_t& begin,
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

// Adds the kWarps partial sums of output (m, n) in warp order and stores it: into the output, or
// into this block's split of the partial sums.
template <typename T, int SUMS>
__device__ __forceinline__ void store_sum(const GemvProblem<T>& p,
                                          const float (&sums)[kWarps][SUMS], int index, int m,
                                          int n) {
  if (m >= p.M || n >= p.N) return;
  float sum = 0.0f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) sum += sums[w][index];
  const int64_t at = static_cast<int64_t>(m) * p.N + n;
  if (p.partial != nullptr) {
    p.partial[blockIdx.y * static_cast<int64_t>(p.M) * p.N + at] = sum;
  } else {
    p.out[at] = static_cast<T>(sum);
  }
}

// K-contiguous weight: block blockIdx.x computes out[:, R bx : R bx + R] (R = kRowsPerBlock) over
// its k range. A split's k range is whole warp steps, not whole block steps, so some of its warps
// may take one step more than others (rung 10 splits the same way).
// W_VECTOR: w's pointer and leading dimension are 16-byte aligned.
template <typename T, int TOKENS, bool W_VECTOR>
__global__ void __launch_bounds__(kThreads) k_major_kernel(GemvProblem<T> p) {
  constexpr int V = kVec<T>, U = kVectorsPerRow<TOKENS>;
  constexpr int kStep = 32 * V * U;  // k of a warp's step
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int n0 = blockIdx.x * kRowsPerBlock;
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
  for (int64_t base = k_begin + warp * kStep; base < k_end; base += kWarps * kStep) {
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

  __shared__ float sums[kWarps][kRowsPerBlock * TOKENS];
#pragma unroll
  for (int r = 0; r < kRowsPerBlock; ++r) {
#pragma unroll
    for (int m = 0; m < TOKENS; ++m) {
      const float sum = sum_over_lanes(acc[r][m], 1, 16);
      if (lane == 0) sums[warp][r * TOKENS + m] = sum;
    }
  }
  __syncthreads();
  const int e = threadIdx.x;
  if (e < kRowsPerBlock * TOKENS) store_sum(p, sums, e, e % TOKENS, n0 + e / TOKENS);
}

// N-contiguous weight: block blockIdx.x computes out[:, C bx : C bx + C] over its k range, C the
// elements of a 128-byte line. W_VECTOR: w's pointer and leading dimension are 16-byte aligned.
template <typename T, int TOKENS, bool W_VECTOR>
__global__ void __launch_bounds__(kThreads) n_major_kernel(GemvProblem<T> p) {
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
  for (int64_t k = k_begin + first_row; k < k_end; k += kNMajorStep) {
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

  __shared__ float sums[kWarps][TOKENS * kColumns];
#pragma unroll
  for (int m = 0; m < TOKENS; ++m) {
#pragma unroll
    for (int i = 0; i < V; ++i) {
      const float sum = sum_over_lanes(acc[m][i], kLanesPerRow, 16);
      if (lane < kLanesPerRow) sums[warp][m * kColumns + column * V + i] = sum;
    }
  }
  __syncthreads();
  for (int e = threadIdx.x; e < TOKENS * kColumns; e += kThreads) {
    store_sum(p, sums, e, e / kColumns, n0 + e % kColumns);
  }
}

// Launches the kernel for up to TOKENS tokens, splitting K over blocks where N gives fewer
// blocks than SMs, then the pass that adds the splits.
template <typename T, int TOKENS>
void launch_gemv(const skinny::Rows& x, const at::Tensor& w, int64_t ldw, bool n_major,
                 at::Tensor& out) {
  const int64_t M = x.data.size(0), K = x.data.size(1), N = out.size(1);
  const int64_t columns = n_major ? kLanesPerRow * kVec<T> : kRowsPerBlock;
  const int step = n_major ? kNMajorStep : 32 * kVec<T> * kVectorsPerRow<TOKENS>;
  const int64_t blocks = ceil_div(N, columns);
  const KSplit split = split_k(blocks, K, step, n_major ? step : int64_t{step} * kWarps,
                               kMaxSplits);
  at::Tensor partial;
  if (split.splits > 1) partial = at::empty({split.splits, M, N}, out.options().dtype(at::kFloat));
  const GemvProblem<T> problem{
      static_cast<const T*>(w.data_ptr()), ldw, static_cast<const T*>(x.data.data_ptr()), x.ld,
      static_cast<T*>(out.data_ptr()), split.splits > 1 ? partial.data_ptr<float>() : nullptr,
      static_cast<int>(M), static_cast<int>(N), static_cast<int>(K), split.k_per_block};
  const KernelLaunch launch(dim3(static_cast<unsigned>(blocks), split.splits), kThreads, 0);
  dispatch_bools(
      [&](auto w_vector_c) {
        constexpr bool kVector = decltype(w_vector_c)::value;
        if (n_major) {
          launch.run(n_major_kernel<T, TOKENS, kVector>, problem);
        } else {
          launch.run(k_major_kernel<T, TOKENS, kVector>, problem);
        }
      },
      skinny::rows_aligned<T>(w.data_ptr(), ldw));
  if (split.splits > 1) {
    sum_splits<T>(partial.data_ptr<float>(), M * N, split.splits, problem.out, M, N, N);
  }
}

// A weight stored row by row ([K, N], N-contiguous) is read in place; any other layout of b as
// w = b.t(), K-contiguous, copied so where it is not.
template <typename T>
void skinny_gemv_typed(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) {
  skinny::check_extents(a, b, "skinny_gemv");
  const skinny::Rows x = skinny::tokens<T>(a);
  const bool n_major = skinny::row_major(b);
  const skinny::Rows w = n_major ? skinny::Rows{b, b.stride(0)} : skinny::weight(b);
  const int64_t M = a.size(0);
  if (M == 1) {
    launch_gemv<T, 1>(x, w.data, w.ld, n_major, out);
  } else if (M == 2) {
    launch_gemv<T, 2>(x, w.data, w.ld, n_major, out);
  } else if (M <= 4) {
    launch_gemv<T, 4>(x, w.data, w.ld, n_major, out);
  } else {
    launch_gemv<T, 8>(x, w.data, w.ld, n_major, out);
  }
}

void skinny_gemv(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) {
  MM_VARIANTS_DISPATCH_CUDA_DTYPES(a.scalar_type(), "mm_variants_cuda_skinny_gemv",
                                   [&] { skinny_gemv_typed<scalar_t>(a, b, out); });
}

bool few_tokens(const at::Tensor& a, const at::Tensor&) { return a.size(0) <= kMaxTokens; }

constexpr const char* kFewTokensOnly =
    "it is for one to eight rows of a (LLM decode of a few sequences) and takes M <= 8; use "
    "another algorithm (or 'auto') for larger M";

// Where `auto` passes this rung over for the rungs below it. Back to back in a CUDA graph (H100,
// weights rotated past L2; N x K of 1024 x 1024, 4096 x 4096, 14336 x 4096 and 4096 x 14336; one
// run, decode.md has a later one):
// - float32 at 1-4 tokens ran faster here than on rungs 10 and 11 (K-contiguous: 1.06-2.02x of
//   torch.mm, where rung 10 ran at 0.72-1.33x; row-major: 0.93-2.51x, rung 11 0.85-2.29x), but
//   on row-major weights of more than 4096 output columns (N) at 4 tokens (N = 14336: 86.1
//   against rung 11's 83.6 us; 3 tokens not measured). At 8 tokens it trailed rung 10 on the
//   three larger K-contiguous weights by 2-21%; on row-major weights it was within 4% of rung 11
//   (either way) on the two larger ones and ahead on the other two; with 5-7 tokens not
//   measured, those stay on rung 11.
// - float32 row-major weights that rung 11 does not read in place (no sm_90a, or rows TMA cannot
//   address) the rungs below copy K-contiguous or, from 1024 x 4096 elements, pass to rung 8,
//   whose time has a floor of a 128-row tile's pass over K: rows one element off alignment took
//   9.1-120 us here at 1-8 tokens (element by element) and 82-575 us on rung 8, 1024 x 1024 to
//   14336 x 4096 (L2 cleared before each call). This rung takes those up to 8 tokens.
// - 16 bits: at one token this rung ran from 3% faster to 16% slower than rungs 10 and 11, and
//   from 4 tokens slower everywhere: its K-contiguous kernel then holds 166 registers or more,
//   one block per SM (2 tokens not measured apart).
bool lower_rung_is_faster(const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() != at::kFloat) return true;
  const bool row_major = skinny::row_major(b);
  if (row_major && !(sm90a(a.device()) && skinny::n_major_in_place<float>(b))) return false;
  const int64_t M = a.size(0);
  if (M <= 2) return false;
  return M > 4 || (row_major && b.size(1) > 4096);
}

// The weight's streaming load asks L2 for 256 bytes, an sm_80 qualifier.
MM_VARIANTS_REGISTER({"skinny_gemv", c10::kCUDA, 12, cuda_dtypes(), &skinny_gemv, &sm80_or_newer,
                      &few_tokens, kFewTokensOnly, /*auto_candidate=*/true,
                      /*run_fused=*/nullptr, /*run_batched=*/nullptr, &lower_rung_is_faster});

}  // namespace
}  // namespace mm_variants::cuda
