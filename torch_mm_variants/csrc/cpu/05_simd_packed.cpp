// Rung 5, simd_packed: packed panels and an explicit SIMD micro-kernel (simd.h, packed.h).
//
// Rung 4 leaves vectorization to the compiler and reads A and B through their strides. Here
// each kc-deep slice of A and B is first copied into contiguous, zero-padded panels in the
// exact order the micro-kernel consumes them; the micro-kernel then does only vector loads,
// broadcasts and FMAs on an mr x nr block held in registers (AVX-512, AVX2+FMA or a portable
// 128-bit fallback, chosen at run time). Packing costs O(MK + KN) per tile, the FMAs O(MNK).
#include "packed.h"

namespace mm_variants::cpu {
namespace {

struct SimdPacked {
  template <typename T>
  static void run(MatrixView<const T> a, MatrixView<const T> b, MatrixView<T> out,
                  const TypedEpilogue<T>& epilogue = {}) {
    const auto kernel = simd::micro_kernel<acc_t<T>>();
    const TileGrid grid = tile_grid(a.rows, b.cols);
    for (int64_t tile = 0; tile < grid.count(); ++tile) {
      compute_tile(a, b, out, grid, tile, kernel, epilogue);
    }
  }
};

// auto passes a product over to rung 4 where padding it to whole micro-kernel blocks at least
// quadruples its output.
bool defers_padded(const at::Tensor& a, const at::Tensor& b, int64_t) {
  return pads_fourfold(a, b);
}

MM_VARIANTS_REGISTER({"simd_packed", c10::kCPU, 5, cpu_dtypes(), &run_rung<SimdPacked>, nullptr, nullptr,
                      "", /*auto_candidate=*/true, &run_rung_fused<SimdPacked>,
                      /*run_batched=*/nullptr, &defers_padded});

}  // namespace
}  // namespace mm_variants::cpu
