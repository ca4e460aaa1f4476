// Rung 6, parallel: the tiles of rung 5 spread over all cores with at::parallel_for.
//
// Output tiles are independent (each packs its own panels and owns its part of C), so no
// synchronization is needed beyond the join at the end; the speed-up is close to the core count
// whenever there are several tiles per core.
#include "packed.h"

#include <ATen/Parallel.h>

namespace mm_variants::cpu {
namespace {

struct Parallel {
  template <typename T>
  static void run(MatrixView<const T> a, MatrixView<const T> b, MatrixView<T> out,
                  const TypedEpilogue<T>& epilogue = {}) {
    const auto kernel = simd::micro_kernel<acc_t<T>>();
    const TileGrid grid = tile_grid(a.rows, b.cols);
    at::parallel_for(0, grid.count(), /*grain_size=*/1, [&](int64_t begin, int64_t end) {
      for (int64_t tile = begin; tile < end; ++tile) {
        compute_tile(a, b, out, grid, tile, kernel, epilogue);
      }
    });
  }
};

// auto passes a product of one tile over to rung 5 (then 4) where padding it to whole
// micro-kernel blocks at least quadruples its output (packed.h). Of several tiles it keeps it:
// its cores may make up for the padding.
bool defers_padded_tile(const at::Tensor& a, const at::Tensor& b, int64_t) {
  return tile_grid(a.size(0), b.size(1)).count() == 1 && pads_fourfold(a, b);
}

MM_VARIANTS_REGISTER({"parallel", c10::kCPU, 6, cpu_dtypes(), &run_rung<Parallel>, nullptr, nullptr,
                      "", /*auto_candidate=*/true, &run_rung_fused<Parallel>,
                      /*run_batched=*/nullptr, &defers_padded_tile});

}  // namespace
}  // namespace mm_variants::cpu
