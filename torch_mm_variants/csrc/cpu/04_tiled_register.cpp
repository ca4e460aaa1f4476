// Rung 4, tiled_register: register blocking inside the cache tiles of rung 3. Each step computes
// a kRows x kCols block of the output in local accumulators (registers) over a kDepth-deep slice
// of K, then adds it to the partial sums.
//
// Rungs 2-3 load and store every partial sum once per k. Here the block's kRows x kCols sums stay
// in registers for the whole slice: each k step loads kRows values of A and kCols values of B for
// kRows * kCols multiply-adds. The slice keeps the kDepth x kCols strip of B that a column of
// blocks shares small enough for the L1 cache, so it is read from memory once per slice. Edge
// blocks take the same code with run-time bounds.
#include "common.h"

#include <algorithm>

namespace mm_variants::cpu {
namespace {

constexpr int kRows = 4, kCols = 8;  // 32 accumulators: the 16 SSE registers of any x86-64
constexpr int64_t kDepth = 256;

// kFull: a whole kRows x kCols block (compile-time bounds); kUnitStride: B's rows are contiguous,
// so the compiler sees plain vector loads instead of a strided gather. The unrolled c loops are
// vectorized across the block's columns (SLP); vectorizing the k loop instead would turn every
// load of B into a gather, so that is switched off here.
template <typename T, bool kFull, bool kUnitStride>
__attribute__((optimize("no-tree-loop-vectorize"))) void register_block(
    MatrixView<const T> a, MatrixView<const T> b, acc_t<T>* sums, int64_t ld_sums, int64_t i0,
    int64_t j0, int64_t p0, int64_t p1, int rows, int cols) {
  using A = acc_t<T>;
  if constexpr (kFull) rows = kRows, cols = kCols;
  A acc[kRows][kCols] = {};
  for (int64_t p = p0; p < p1; ++p) {
    A b_row[kCols];
    const T* b_p = &b(p, j0);
    const int64_t step = kUnitStride ? 1 : b.col_stride;
#pragma GCC unroll 16
    for (int c = 0; c < kCols; ++c) b_row[c] = c < cols ? static_cast<A>(b_p[c * step]) : A(0);
#pragma GCC unroll 4
    for (int r = 0; r < kRows; ++r) {
      const A a_rp = r < rows ? static_cast<A>(a(i0 + r, p)) : A(0);
#pragma GCC unroll 16
      for (int c = 0; c < kCols; ++c) acc[r][c] += a_rp * b_row[c];
    }
  }
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) sums[(i0 + r) * ld_sums + j0 + c] += acc[r][c];
}

struct TiledRegister {
  template <typename T>
  static void run(MatrixView<const T> a, MatrixView<const T> b, MatrixView<T> out) {
    const int64_t m = a.rows, k = a.cols, n = b.cols;
    std::vector<acc_t<T>> sums(m * n, acc_t<T>(0));
    for (int64_t p0 = 0; p0 < k; p0 += kDepth) {
      const int64_t p1 = std::min(p0 + kDepth, k);
      for (int64_t j0 = 0; j0 < n; j0 += kCols) {
        const int cols = static_cast<int>(std::min<int64_t>(kCols, n - j0));
        for (int64_t i0 = 0; i0 < m; i0 += kRows) {
          const int rows = static_cast<int>(std::min<int64_t>(kRows, m - i0));
          const bool full = rows == kRows && cols == kCols;
          if (full && b.col_stride == 1) {
            register_block<T, true, true>(a, b, sums.data(), n, i0, j0, p0, p1, rows, cols);
          } else if (full) {
            register_block<T, true, false>(a, b, sums.data(), n, i0, j0, p0, p1, rows, cols);
          } else {
            register_block<T, false, false>(a, b, sums.data(), n, i0, j0, p0, p1, rows, cols);
          }
        }
      }
    }
    store_sums(sums, out);
  }
};

// auto runs it where rungs 5 and 6 pass a product over: one they would pad to whole
// micro-kernel blocks of four times its output or more (packed.h).
MM_VARIANTS_REGISTER({"tiled_register", c10::kCPU, 4, cpu_dtypes(), &run_rung<TiledRegister>,
                      nullptr, nullptr, "", /*auto_candidate=*/false, /*run_fused=*/nullptr,
                      /*run_batched=*/nullptr, /*defers_to_lower=*/nullptr,
                      /*auto_where_deferred_to=*/true});

}  // namespace
}  // namespace mm_variants::cpu
