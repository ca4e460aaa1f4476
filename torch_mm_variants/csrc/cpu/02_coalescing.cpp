// Rung 2, coalescing (the CPU analogue): reorder the loops to (i, k, j) so the innermost loop
// streams a row of B and a row of the output.
//
// On the GPU, coalescing makes neighbouring threads read neighbouring addresses; on the CPU the
// same idea is making consecutive iterations read consecutive addresses. Each a(i, k) is loaded
// once and multiplied into a whole row of B, every cache line fetched is used in full, and the
// contiguous inner loop is one the compiler can vectorize.
#include "common.h"

namespace mm_variants::cpu {
namespace {

struct Coalescing {
  template <typename T>
  static void run(MatrixView<const T> a, MatrixView<const T> b, MatrixView<T> out) {
    std::vector<acc_t<T>> row(b.cols);
    for (int64_t i = 0; i < a.rows; ++i) {
      std::fill(row.begin(), row.end(), acc_t<T>(0));
      for (int64_t p = 0; p < a.cols; ++p) add_scaled_row(row.data(), acc_t<T>(a(i, p)), b, p, 0, b.cols);
      for (int64_t j = 0; j < b.cols; ++j) out(i, j) = static_cast<T>(row[j]);
    }
  }
};

MM_VARIANTS_REGISTER({"coalescing", c10::kCPU, 2, cpu_dtypes(), &run_rung<Coalescing>,
                      nullptr, nullptr, "", /*auto_candidate=*/false});

}  // namespace
}  // namespace mm_variants::cpu
