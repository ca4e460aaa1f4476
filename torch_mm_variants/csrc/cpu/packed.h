// The packed-panel GEMM shared by rungs 5 (simd_packed) and 6 (parallel): the output is cut
// into independent kTileM x kTileN tiles, and each tile is computed by packing panels of A and
// B into contiguous buffers and running the SIMD micro-kernel over them.
//
// Packing copies a kc-deep slice of A into mr-row panels and of B into nr-column panels, laid out
// in exactly the order the micro-kernel reads them: whatever the input strides (transposed,
// sliced) or dtype (16-bit inputs are widened here), the inner loop sees unit-stride float or
// double data. Panels are zero-padded to whole mr x nr blocks, so edge tiles need no special
// case: the tile's accumulator buffer is padded too and only its valid part is written out.
#pragma once

#include "common.h"
#include "simd.h"

#include <algorithm>

namespace mm_variants::cpu {

constexpr int64_t kPackDepth = 256;  // kc: one slice of K; a B micro-panel (kc x nr) fits L1
constexpr int64_t kTileM = 168;      // rows of a C tile, a multiple of both micro-kernel mr
constexpr int64_t kTileN = 256;      // columns of a C tile; A block + B panel + C tile fit L2

inline int64_t round_up(int64_t x, int64_t multiple) { return (x + multiple - 1) / multiple * multiple; }

struct TileGrid {
  int64_t rows, cols;
  int64_t count() const { return rows * cols; }
};

inline TileGrid tile_grid(int64_t m, int64_t n) {
  return {(m + kTileM - 1) / kTileM, (n + kTileN - 1) / kTileN};
}

// Whether padding the output to whole micro-kernel blocks at least quadruples it (a product of
// few rows or columns): the packed rungs would then mostly multiply zeros, and rung 4's register
// tiles, which pad nothing, were measured faster (a 2-core AVX-512 Xeon, K = 65536, one tile:
// 1.4-13 times at a fourfold padding or more, as fast or slower at twofold or less).
template <typename A>
bool pads_fourfold(int64_t m, int64_t n) {
  const simd::MicroKernel<A> shape = simd::micro_kernel_shape<A>();
  const double padded = double(round_up(m, shape.mr)) * double(round_up(n, shape.nr));
  return m > 0 && n > 0 && padded >= 4.0 * double(m) * double(n);
}

inline bool pads_fourfold(const at::Tensor& a, const at::Tensor& b) {
  const int64_t m = a.size(0), n = b.size(1);
  return a.scalar_type() == at::kDouble ? pads_fourfold<double>(m, n) : pads_fourfold<float>(m, n);
}

// Packs a(i0 : i0 + rows, p0 : p0 + depth) into panels of mr rows: panel r holds, for each p,
// the mr values a(i0 + r * mr + 0 .. mr - 1, p0 + p), zero past the last row.
template <typename T, typename A>
void pack_a(MatrixView<const T> a, int64_t i0, int64_t rows, int64_t p0, int64_t depth, int mr,
            A* dst) {
  for (int64_t r0 = 0; r0 < rows; r0 += mr) {
    for (int64_t p = 0; p < depth; ++p) {
      for (int r = 0; r < mr; ++r) {
        *dst++ = r0 + r < rows ? static_cast<A>(a(i0 + r0 + r, p0 + p)) : A(0);
      }
    }
  }
}

// Packs b(p0 : p0 + depth, j0 : j0 + cols) into panels of nr columns, zero past the last column.
template <typename T, typename A>
void pack_b(MatrixView<const T> b, int64_t p0, int64_t depth, int64_t j0, int64_t cols, int nr,
            A* dst) {
  for (int64_t c0 = 0; c0 < cols; c0 += nr) {
    for (int64_t p = 0; p < depth; ++p) {
      for (int c = 0; c < nr; ++c) {
        *dst++ = c0 + c < cols ? static_cast<A>(b(p0 + p, j0 + c0 + c)) : A(0);
      }
    }
  }
}

// Computes tile `index` of `grid` of out = epilogue(a @ b) with the micro-kernel `kernel`; the
// epilogue (linear's bias and activation, or nothing) acts on the float sums as they are stored.
template <typename T>
void compute_tile(MatrixView<const T> a, MatrixView<const T> b, MatrixView<T> out,
                  TileGrid grid, int64_t index, const simd::MicroKernel<acc_t<T>>& kernel,
                  const TypedEpilogue<T>& epilogue) {
  using A = acc_t<T>;
  const int64_t i0 = index / grid.cols * kTileM, j0 = index % grid.cols * kTileN;
  const int64_t rows = std::min(kTileM, a.rows - i0), cols = std::min(kTileN, b.cols - j0);
  const int64_t padded_rows = round_up(rows, kernel.mr), padded_cols = round_up(cols, kernel.nr);
  const int64_t depth_max = std::min(kPackDepth, a.cols);

  std::vector<A> a_packed(padded_rows * depth_max), b_packed(padded_cols * depth_max);
  std::vector<A> c_tile(padded_rows * padded_cols);
  for (int64_t p0 = 0; p0 < a.cols; p0 += kPackDepth) {
    const int64_t depth = std::min(kPackDepth, a.cols - p0);
    pack_b(b, p0, depth, j0, cols, kernel.nr, b_packed.data());
    pack_a(a, i0, rows, p0, depth, kernel.mr, a_packed.data());
    for (int64_t c0 = 0; c0 < padded_cols; c0 += kernel.nr) {
      for (int64_t r0 = 0; r0 < padded_rows; r0 += kernel.mr) {
        kernel.run(depth, &a_packed[r0 * depth], &b_packed[c0 * depth],
                   &c_tile[r0 * padded_cols + c0], padded_cols, /*accumulate=*/p0 > 0);
      }
    }
  }
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      out(i0 + r, j0 + c) = static_cast<T>(epilogue(c_tile[r * padded_cols + c], j0 + c));
}

}  // namespace mm_variants::cpu
