// Rung 4, tiled_register: register blocking. Each step computes a kRows x kCols block of the
// output held in local accumulators (registers), over the full depth K.
//
// Rungs 2-3 load and store every partial sum of the output once per k. Here a block of
// kRows x kCols sums stays in registers for the whole k loop: each k step loads kRows values of
// A and kCols values of B and does kRows * kCols multiply-adds, so arithmetic per memory access
// grows from 1 to kRows * kCols / (kRows + kCols). Edge blocks take the same code with run-time
// bounds.
#include "common.h"

#include <algorithm>

namespace mm_variants::cpu {
namespace {

constexpr int kRows = 4, kCols = 8;

// kFull: a whole kRows x kCols block (compile-time bounds); kUnitStride: B's rows are contiguous,
// so the compiler sees plain vector loads instead of a strided gather. The unrolled c loops are
// vectorized across the block's columns (SLP); vectorizing the k loop instead would turn every
// load of B into a gather, so that is switched off here.
template <typename T, bool kFull, bool kUnitStride>
__attribute__((optimize("no-tree-loop-vectorize"))) void register_block(MatrixView<const T> a, MatrixView<const T> b, MatrixView<T> out,
                    int64_t i0, int64_t j0, int rows, int cols) {
  using A = acc_t<T>;
  if constexpr (kFull) rows = kRows, cols = kCols;
  A acc[kRows][kCols] = {};
  for (int64_t p = 0; p < a.cols; ++p) {
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
    for (int c = 0; c < cols; ++c) out(i0 + r, j0 + c) = static_cast<T>(acc[r][c]);
}

struct TiledRegister {
  template <typename T>
  static void run(MatrixView<const T> a, MatrixView<const T> b, MatrixView<T> out) {
    for (int64_t i0 = 0; i0 < a.rows; i0 += kRows) {
      for (int64_t j0 = 0; j0 < b.cols; j0 += kCols) {
        const int rows = static_cast<int>(std::min<int64_t>(kRows, a.rows - i0));
        const int cols = static_cast<int>(std::min<int64_t>(kCols, b.cols - j0));
        const bool full = rows == kRows && cols == kCols;
        if (full && b.col_stride == 1) {
          register_block<T, true, true>(a, b, out, i0, j0, rows, cols);
        } else if (full) {
          register_block<T, true, false>(a, b, out, i0, j0, rows, cols);
        } else {
          register_block<T, false, false>(a, b, out, i0, j0, rows, cols);
        }
      }
    }
  }
};

MM_VARIANTS_REGISTER({"tiled_register", c10::kCPU, 4, cpu_dtypes(), &run_rung<TiledRegister>,
                      nullptr, nullptr, "", /*auto_candidate=*/false});

}  // namespace
}  // namespace mm_variants::cpu
