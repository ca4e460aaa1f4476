// Rung 3, tiled: cache blocking. The (i, k, j) loops of rung 2 run over blocks of
// kTileM x kTileK of A and kTileK x kTileN of B, sized to stay in the L2 cache.
//
// Rung 2 streams all of B once per row of A, so for large N * K every row re-reads B from main
// memory. Here a block of B is reused by kTileM rows of A while it is still cached, cutting
// memory traffic for B by that factor. Partial sums live in a float (or double) workspace so
// that 16-bit outputs are rounded once, at the end.
#include "common.h"

#include <algorithm>

namespace mm_variants::cpu {
namespace {

constexpr int64_t kTileM = 64, kTileK = 128, kTileN = 256;

struct Tiled {
  template <typename T>
  static void run(MatrixView<const T> a, MatrixView<const T> b, MatrixView<T> out) {
    const int64_t m = a.rows, k = a.cols, n = b.cols;
    std::vector<acc_t<T>> acc(m * n, acc_t<T>(0));
    for (int64_t i0 = 0; i0 < m; i0 += kTileM) {
      for (int64_t p0 = 0; p0 < k; p0 += kTileK) {
        for (int64_t j0 = 0; j0 < n; j0 += kTileN) {
          const int64_t i1 = std::min(i0 + kTileM, m), p1 = std::min(p0 + kTileK, k),
                        j1 = std::min(j0 + kTileN, n);
          for (int64_t i = i0; i < i1; ++i) {
            acc_t<T>* acc_row = &acc[i * n];
            for (int64_t p = p0; p < p1; ++p) add_scaled_row(acc_row, acc_t<T>(a(i, p)), b, p, j0, j1);
          }
        }
      }
    }
    store_sums(acc, out);
  }
};

MM_VARIANTS_REGISTER({"tiled", c10::kCPU, 3, cpu_dtypes(), &run_rung<Tiled>,
                      nullptr, nullptr, "", /*auto_candidate=*/false});

}  // namespace
}  // namespace mm_variants::cpu
