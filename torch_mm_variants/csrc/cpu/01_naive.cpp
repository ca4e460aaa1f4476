// Rung 1, naive: one dot product per output element, the textbook triple loop (i, j, k).
//
// The inner loop walks a row of A and a column of B. With B row-major, each step of k jumps a
// whole row of B, so every load touches a new cache line: this is the baseline every later rung
// improves on.
#include "common.h"

namespace mm_variants::cpu {
namespace {

struct Naive {
  template <typename T>
  static void run(MatrixView<const T> a, MatrixView<const T> b, MatrixView<T> out) {
    for (int64_t i = 0; i < a.rows; ++i) {
      for (int64_t j = 0; j < b.cols; ++j) {
        acc_t<T> sum = 0;
        for (int64_t p = 0; p < a.cols; ++p) {
          sum += static_cast<acc_t<T>>(a(i, p)) * static_cast<acc_t<T>>(b(p, j));
        }
        out(i, j) = static_cast<T>(sum);
      }
    }
  }
};

MM_VARIANTS_REGISTER({"naive", c10::kCPU, 1, cpu_dtypes(), &run_rung<Naive>,
                      nullptr, nullptr, "", /*auto_candidate=*/false});

}  // namespace
}  // namespace mm_variants::cpu
