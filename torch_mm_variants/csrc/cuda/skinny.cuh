// What the skinny rungs (10: mma.sync on any sm_80+, 11: TMA and wgmma on sm_90a, 12: CUDA-core
// dot products) share: the operands as they read them (x [M, K] and the nn.Linear weight w [N, K],
// both K-contiguous, or a weight stored row by row [K, N]), the problem rungs 10 and 12 hand their
// kernels with its K split, and their loads.
#pragma once

#include "../matmul.h"
#include "common.cuh"
#include "k_splits.cuh"

#include <ATen/ops/empty.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <utility>

namespace mm_variants::cuda::skinny {

// Rung 10 takes at most this many rows of a: the tokens of LLM decode.
constexpr int kMaxM = 64;

inline bool few_rows(const at::Tensor& a, const at::Tensor&) { return a.size(0) <= kMaxM; }

constexpr const char* kFewRowsOnly =
    "it is for few rows of a (LLM decode) and takes M <= 64; use another algorithm (or 'auto') "
    "for larger M";

// Rung 11 takes up to kMaxTmaM rows: its tokens are wgmma's N, which reaches 256, and 128 of them
// still leave a float32 block of 64 weight rows its registers (two sets of 64 sums a thread).
constexpr int kMaxTmaM = 128;

inline bool tma_rows(const at::Tensor& a, const at::Tensor&) { return a.size(0) <= kMaxTmaM; }

constexpr const char* kTmaRowsOnly =
    "it is for few rows of a (LLM decode, small batches) and takes M <= 128; use another "
    "algorithm (or 'auto') for larger M";

// Whether `ld` and `ptr` allow BYTES-wide loads of T rows.
template <typename T, int BYTES = 16>
bool rows_aligned(const void* ptr, int64_t ld) {
  return reinterpret_cast<uintptr_t>(ptr) % BYTES == 0 && (ld * sizeof(T)) % BYTES == 0;
}

// An operand as the rungs read it: row r, element k at data + r * ld + k. A single row has
// leading dimension 0.
struct Rows {
  at::Tensor data;
  int64_t ld;
};

// Whether b [K, N] is a weight stored row-major (N-contiguous, x @ w for a w kept [in, out]),
// which batch_weights would copy K-contiguous. Rung 10 reads 16-bit ones in place.
inline bool row_major(const at::Tensor& b) {
  return b.size(0) > 1 && b.size(1) > 1 && b.stride(1) == 1 && b.stride(0) != 1;
}

// Whether b is a row-major weight whose rows TMA can address in place (16-byte aligned, none
// overlapping): rung 11 reads its tiles N-major, where a K-contiguous copy would take longer than
// the product.
template <typename T>
bool n_major_in_place(const at::Tensor& b) {
  return row_major(b) && b.stride(0) >= b.size(1) && rows_aligned<T>(b.data_ptr(), b.stride(0));
}

// check(T{}) for an element of a's size as rung 11 reads it: float, or any 16-bit type (the
// alignment checks below depend on the size only).
template <typename F>
bool for_element_of(const at::Tensor& a, F&& check) {
  return a.scalar_type() == at::kFloat ? check(float{}) : check(c10::Half{});
}

// Whether rung 11 (on sm_90a) reads b in place N-major, for a's dtype.
inline bool tma_reads_n_major(const at::Tensor& a, const at::Tensor& b) {
  return for_element_of(a, [&](auto t) { return n_major_in_place<decltype(t)>(b); });
}

// Whether rung 11 (on sm_90a) reads b's K-contiguous w = b.t() (an nn.Linear weight, attention's
// keys) in place: rows that start 16-byte aligned.
inline bool tma_reads_k_major(const at::Tensor& a, const at::Tensor& b) {
  if (row_major(b) || !(b.stride(0) == 1 || b.size(0) == 1)) return false;
  const int64_t ld = b.size(1) == 1 ? 0 : b.stride(1);
  return for_element_of(a, [&](auto t) { return rows_aligned<decltype(t)>(b.data_ptr(), ld); });
}

// Rung 10's short_rows_kernel: 16-bit K-contiguous rows of at most kShortMaxChunks chunks of
// kShortChunk k (a 16-byte vector on each of 4 lanes), its tokens in tiles of 8.
constexpr int kShortChunk = 32;
constexpr int kShortMaxChunks = 8;  // 256 k
// Chunks times token tiles: the x vectors a lane holds (16: 64 registers; the kernel then holds
// 100-164, no spills). More tiles are taken in passes of at most this many.
constexpr int kShortMaxFragments = 16;

// The least power of two at least n.
inline int64_t power_of_two_above(int64_t n) {
  int64_t p = 1;
  while (p < n) p *= 2;
  return p;
}

// Chunks of 32 k times token tiles of 8, each rounded up to a power of two: the x vectors a lane
// of short_rows_kernel holds.
inline int64_t short_rows_fragments(int64_t M, int64_t K) {
  return power_of_two_above((K + kShortChunk - 1) / kShortChunk) * power_of_two_above((M + 7) / 8);
}

// Whether skinny_kernel's blocks of 16 rows over `rows` weight rows (N, times a batch's entries)
// all fit on the GPU at once, two per SM: ceil(rows / 16) <= 2 sms, at most 32 rows per SM.
inline bool rung10_blocks_fit_at_once(int64_t rows, int64_t sms) { return rows <= 32 * sms; }

// Whether skinny_kernel's blocks of 16 rows over `rows` weight rows are fewer than the SMs, so
// that it splits K over blocks (split_for) and adds the splits in a second pass.
inline bool rung10_splits_k(int64_t rows, int64_t sms) { return ceil_div(rows, 16) < sms; }

// Whether short_rows_kernel takes M tokens of K-contiguous 16-bit rows of K elements over `rows`
// weight rows (N, times a batch's entries), rows 16-byte aligned: K of at most 256, and 1-8
// tokens, or up to 64 where the launch has more than 32 rows per SM. Where chunks x token tiles
// pass 16, the x fragments of every chunk and tile would not fit in registers, and the kernel
// takes the tiles in passes against weight vectors loaded once. Back to back in CUDA graphs
// (weights rotated past L2, H200, bf16 and fp16; decode.md "Short rows in token tiles", "Short
// rows stored in whole sectors", "Short rows at 16 fragments" and "Short rows in passes"): at
// 9-64 tokens batches of 8-128 entries of 4096-8192 keys of 32-128 elements ran at 0.90-1.04x of
// torch.bmm where chunks x tiles are at most 8, and 32 entries at 16 (K of 128 at 17-32 tokens,
// 256 at 9-16, 64 at 33-64) at 0.67-0.83x, where skinny_kernel ran 0.16-0.44x; past 16, in
// passes, batches of 8 and 32 entries of 2048-8192 keys of 128 and 256 elements at 0.48-0.70x,
// where skinny_kernel ran 0.23-0.44x. 14336-16384 rows of 32-128 elements at 1.03-1.38x of
// torch.mm, where rung 11 ran 0.59-1.18x (rung 11 keeps the single products from 16 fragments
// on but on rows of at most 64 elements: rung10_is_faster).
// Up to 32 rows per SM skinny_kernel's blocks of 16 rows fit on the GPU at once (two per SM), and
// it was the faster: 4096 rows at 16 tokens, 64 blocks of 4 warps here, took 2.46 against 2.22
// us (with 2-byte stores). Past them its blocks take a second wave, and on 4352-6144 rows of 32,
// 64 and 128 elements at 9-64 tokens (bf16, 42 cases) this kernel ran at 0.85-1.26x of torch.mm
// where rung 11 ran 0.68-1.18x (decode.md, "Short rows from 32 rows per SM").
inline bool short_rows_fit(int64_t M, int64_t K, int64_t rows, int64_t sms) {
  if (K > kShortMaxChunks * kShortChunk) return false;
  if (M <= 8) return true;
  return M <= kMaxM && !rung10_blocks_fit_at_once(rows, sms);
}

// Whether b [K, N] is a weight stored row-major that rung 8 multiplies faster than rung 10 (on
// sm_90a rung 11 first takes those TMA can address). Back to back in a CUDA graph (weights rotated
// past L2, H100, naming the rungs):
// - float32 ones, which rung 10 copies K-contiguous, from 1024 x 4096 elements. Rung 8's time has
//   a floor (one 128-row tile per k range: 40 us in float32 from K = 512), which the copy stays
//   under on smaller weights: rung 10 was the faster from 64 x 1024 up to 1024 x 1024 (there
//   15.5-19.0 against 39.9-40.9 us), rung 8 on 1024 x 4096 and 2048 x 2048 (40.1-41.5 against
//   44.7-57.4).
// - 16-bit ones, which rung 10 reads in place, from 33 tokens on weights of more than 4096 x 4096
//   elements whose rows rung 8 loads as 16-byte vectors: at 64 tokens 58.7 against 84.2 us on
//   14336 x 4096 and 54.1 against 77.6 on 4096 x 14336. Up to 32 tokens rung 10 reads such rows
//   in blocks of 32 columns and was ahead on every weight (there 41.5-47.5 against 49.0-54.9
//   us), and on 4096 x 4096 at 64 tokens too (23.6 against 24.7). Rows that rung 8 would load
//   element by element stay on rung 10 (N odd: rung 8 took 81-323 us, rung 10 7.8-110).
inline bool rung8_is_faster_on_row_major(const at::Tensor& a, const at::Tensor& b) {
  if (!row_major(b)) return false;
  const int64_t M = a.size(0), K = b.size(0), N = b.size(1);
  if (a.scalar_type() == at::kFloat) return N * K >= 4096 * 1024;
  return M > 32 && N * K > 4096 * 4096 && rows_aligned<c10::Half>(b.data_ptr(), b.stride(0));
}

// K elements of T rounded up to whole 16-byte vectors: the pitch of a padded row.
template <typename T>
constexpr int64_t padded_pitch(int64_t K) {
  constexpr int64_t kVec = 16 / sizeof(T);
  return (K + kVec - 1) / kVec * kVec;
}

// A copy of the matrix t [rows, K] with K-contiguous rows padded to whole 16-byte vectors.
template <typename T>
Rows padded_copy(const at::Tensor& t) {
  const int64_t K = t.size(1), padded = padded_pitch<T>(K);
  at::Tensor copy = at::empty({t.size(0), padded}, t.options()).narrow(1, 0, K);
  copy.copy_(t);
  return {copy, padded};
}

// The decode product out = x @ w as rungs 10 and 12 hand it to their kernels, blocks splitting K.
template <typename T>
struct Problem {
  const T* w;  // K-contiguous: w[n][k] at w[n * ldw + k]; N-contiguous: w[k][n] at w[k * ldw + n]
  int64_t ldw;
  const T* x;  // x[m][k] at x[m * ldx + k]; rows 16-byte aligned
  int64_t ldx;
  T* out;          // [M][N], contiguous
  float* partial;  // [gridDim.y][gridDim.z][M][N] (splits, entries) when blocks split K, else null
  int M, N, K;
  int64_t k_per_block;
  // A batch (run_batched of rungs 10 and 12): entry blockIdx.z's w, x and out lie these many
  // elements past entry 0's (w's 0 where the entries share it). A single product is one entry.
  int64_t batch_w = 0, batch_x = 0, batch_out = 0;
};

// The skinny rungs index N and K with int.
inline void check_extents(const at::Tensor& a, const at::Tensor& b, const char* algorithm) {
  const int64_t M = a.size(0), K = a.size(1), N = b.size(1);
  TORCH_CHECK(N <= INT_MAX && K <= INT_MAX, "torch_mm_variants: ", algorithm,
              " takes N and K below 2^31, got ", M, "x", K, " and ", K, "x", N);
}

// The entries of a batch that one launch multiplies, and their strides in elements (see Problem).
struct Batch {
  int64_t entries = 1;
  int64_t x = 0, w = 0, out = 0;
};

constexpr int kMaxSplits = 16;  // of a product's K

// How the blocks of a product, or of all a batch's entries together, split K (split_k): where
// they are fewer than the SMs. A batch of a few entries of few columns (p @ v at decode, 8 x
// [4096, 128] in float32 takes 32 blocks) would otherwise leave most SMs idle: split there, rungs
// 10 and 12 ran such batches 1.1-2.7 times as fast (decode.md).
inline KSplit split_for(const Batch& batch, int64_t blocks, int64_t K, int step, int64_t min_k) {
  return split_k(blocks * batch.entries, K, step, min_k, kMaxSplits);
}

// f(std::integral_constant<int, P>), P the least of 1, 2, 4 and 8 that is at least n (and 8 past
// it): a kernel's count of tokens, warps or chunks as a template argument.
template <typename F>
void dispatch_power_of_two(int64_t n, F&& f) {
  if (n <= 1) return f(std::integral_constant<int, 1>{});
  if (n <= 2) return f(std::integral_constant<int, 2>{});
  if (n <= 4) return f(std::integral_constant<int, 4>{});
  f(std::integral_constant<int, 8>{});
}

// The grid of `blocks` blocks along N, the product's splits of K, and a batch's entries.
inline dim3 grid_of(int64_t blocks, int splits, const Batch& batch) {
  return dim3(static_cast<unsigned>(blocks), splits, static_cast<unsigned>(batch.entries));
}

// Whether the weight rows of every entry of `batch` (entry 0's at ptr, ld apart) allow BYTES-wide
// loads.
template <typename T, int BYTES = 16>
bool rows_aligned(const void* ptr, int64_t ld, const Batch& batch) {
  return rows_aligned<T, BYTES>(ptr, ld) &&
         (batch.w * static_cast<int64_t>(sizeof(T))) % BYTES == 0;
}

// The tokens of a batch a [B, M, K] as the kernels read them (entry 0's rows, and the entries'
// stride): a itself where every entry's rows are K-contiguous and 16-byte aligned, else a copy
// with padded rows.
template <typename T>
std::pair<Rows, int64_t> batch_tokens(const at::Tensor& a) {
  const int64_t entries = a.size(0), M = a.size(1), K = a.size(2);
  const int64_t ld = M == 1 ? 0 : a.stride(1);
  const bool entries_aligned =
      entries == 1 || (a.stride(0) * static_cast<int64_t>(sizeof(T))) % 16 == 0;
  if ((a.stride(2) == 1 || K == 1) && rows_aligned<T>(a.data_ptr(), ld) && entries_aligned) {
    return {{a.select(0, 0), ld}, a.stride(0)};
  }
  const int64_t padded = padded_pitch<T>(K);
  at::Tensor copy = at::empty({entries, M, padded}, a.options()).narrow(2, 0, K);
  copy.copy_(a);
  return {{copy.select(0, 0), padded}, M * padded};
}

// x = a [M, K] with K-contiguous, 16-byte aligned rows; otherwise a copy with padded rows, which
// costs little next to the weight.
template <typename T>
Rows tokens(const at::Tensor& a) {
  return batch_tokens<T>(a.unsqueeze(0)).first;
}

// The weights of a batch b [B, K, N] (or a shared [K, N]) as a rung reads them: entry 0's rows and
// the entries' stride (0 where shared). Row-major entries ([K, N], N-contiguous) in place where
// the rung reads them so (n_major), else w = b^T per entry, K-contiguous, in place (an nn.Linear
// weight's w.t(), attention's keys in q @ k^T) or copied so.
inline std::pair<Rows, int64_t> batch_weights(const at::Tensor& b, bool n_major) {
  const bool shared = b.dim() == 2;
  if (n_major) return {{shared ? b : b.select(0, 0), b.stride(-2)}, shared ? 0 : b.stride(0)};
  const int64_t K = b.size(-2), N = b.size(-1);
  at::Tensor w = b.transpose(-2, -1);
  if (!(w.stride(-1) == 1 || K == 1)) w = w.contiguous();
  return {{shared ? w : w.select(0, 0), N == 1 ? 0 : w.stride(-2)}, shared ? 0 : w.stride(0)};
}

// Calls f(a, b, out) on parts of a bmm batch (registry.h's run_batched) of at most 65535 entries,
// gridDim.z's limit, and checks the extents once.
template <typename F>
void in_grid_sized_parts(const at::Tensor& a, const at::Tensor& b, at::Tensor& out,
                         const char* algorithm, F&& f) {
  const bool shared = b.dim() == 2;
  check_extents(a.select(0, 0), shared ? b : b.select(0, 0), algorithm);
  constexpr int64_t kMaxEntries = 65535;
  for (int64_t first = 0; first < a.size(0); first += kMaxEntries) {
    const int64_t entries = std::min(a.size(0) - first, kMaxEntries);
    at::Tensor out_part = out.narrow(0, first, entries);
    f(a.narrow(0, first, entries), shared ? b : b.narrow(0, first, entries), out_part);
  }
}

// The Problem of x [M, K] times w into out [M, N], K split as `split` says: it owns the buffer
// of the splits' partial sums, and add_splits, after the kernel, adds them into out.
template <typename T>
class SplitProduct {
 public:
  // x, w and out are entry 0's of `batch`.
  SplitProduct(const Rows& x, const Rows& w, at::Tensor& out, const KSplit& split,
               const Batch& batch = {})
      : splits_(split.splits), entries_(batch.entries), out_stride_(batch.out) {
    const int64_t M = x.data.size(0), K = x.data.size(1), N = out.size(1);
    if (splits_ > 1) {
      partial_ = new_scratch({splits_, entries_, M, N}, out.options().dtype(at::kFloat));
    }
    problem_ = Problem<T>{static_cast<const T*>(w.data.data_ptr()),
                          w.ld,
                          static_cast<const T*>(x.data.data_ptr()),
                          x.ld,
                          static_cast<T*>(out.data_ptr()),
                          splits_ > 1 ? partial_.data_ptr<float>() : nullptr,
                          static_cast<int>(M),
                          static_cast<int>(N),
                          static_cast<int>(K),
                          split.k_per_block,
                          batch.w,
                          batch.x,
                          batch.out};
  }

  const Problem<T>& problem() const { return problem_; }
  int splits() const { return splits_; }

  // The pass that adds the splits in order, where there are several (k_splits.cuh).
  void add_splits() const {
    if (splits_ == 1) return;
    // One row of M * N sums per entry (each entry's out is contiguous), entries out_stride_ apart.
    const int64_t MN = static_cast<int64_t>(problem_.M) * problem_.N;
    sum_splits<T>(problem_.partial, entries_ * MN, splits_, problem_.out, entries_, MN,
                  out_stride_);
  }

 private:
  int splits_;
  int64_t entries_, out_stride_;
  at::Tensor partial_;
  Problem<T> problem_{};
};

// ---- Device helpers of the skinny rungs: loads and stores ----------------------------------

// The problem of this block's entry of a batch (blockIdx.z; entry 0 of a single product).
template <typename T>
__device__ __forceinline__ Problem<T> entry_of_batch(Problem<T> p) {
  p.w += blockIdx.z * p.batch_w;
  p.x += blockIdx.z * p.batch_x;
  p.out += blockIdx.z * p.batch_out;
  return p;
}

// Stores output (m, n)'s sum over this block's k range: into out, or, where blocks split K, into
// this block's split (blockIdx.y) of its entry's (blockIdx.z) partial sums.
template <typename T>
__device__ __forceinline__ void store_sum(const Problem<T>& p, int m, int n, float sum) {
  const int64_t at = static_cast<int64_t>(m) * p.N + n;
  if (p.partial != nullptr) {
    const int64_t slice = blockIdx.y * gridDim.z + blockIdx.z;
    p.partial[slice * p.M * p.N + at] = sum;
  } else {
    p.out[at] = static_cast<T>(sum);
  }
}

// Consecutive elements of a row from p, as many as Q holds, of which `left` lie inside the
// matrix: element by element with zeros past the end, where a vector load cannot take them.
template <typename Q, typename E>
__device__ __forceinline__ Q load_elements(const E* p, int left) {
  constexpr int kElems = sizeof(Q) / sizeof(E);
  Vec<E, kElems> v;
#pragma unroll
  for (int e = 0; e < kElems; ++e) v.v[e] = e < left ? p[e] : E(0);
  return *reinterpret_cast<const Q*>(&v);
}

// One 16-byte load that bypasses L1 and asks L2 to fetch the surrounding 256 bytes: for the
// weight, which every block reads once.
__device__ __forceinline__ uint4 load_streaming(const void* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];\n"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

// The 16 bytes of a row starting at p, of which `left` elements lie inside the matrix: one vector
// load when VECTOR (p is 16-byte aligned) and all are inside, else element by element with zeros
// past the end.
template <bool VECTOR, bool STREAMING, typename E>
__device__ __forceinline__ uint4 load_row(const E* p, int left) {
  constexpr int kVec = 16 / sizeof(E);
  if (VECTOR && left >= kVec) {
    return STREAMING ? load_streaming(p) : __ldg(reinterpret_cast<const uint4*>(p));
  }
  return load_elements<uint4>(p, left);
}

// Word i of a vector held in registers.
__device__ __forceinline__ uint32_t word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

__device__ __forceinline__ uint32_t word(const uint2& v, int i) { return i == 0 ? v.x : v.y; }

}  // namespace mm_variants::cuda::skinny
