// Rung 3, tiled: shared-memory cache blocking. A block computes a TILE x TILE tile of out,
// walking k in steps of TILE: it copies a TILE x TILE tile of A and one of B into shared memory
// (TileLoader, predicated at the matrix edges), syncs, and every thread accumulates its dot
// product from shared memory. Each element read from global memory now serves TILE threads
// instead of one.
//
// Shared tiles in their natural layouts, A as [m][k] and B as [k][n], rows padded to TILE + 1
// floats so that the copies that transpose (column-major A, column-major B) hit 32 banks.
// Tile: TILE = 32; 1024 threads, one output element each.
#include "common.cuh"

namespace mm_variants::cuda {
namespace {

template <int TILE, typename G>
__global__ void __launch_bounds__(TILE * TILE) tiled_kernel(G g) {
  constexpr int kThreads = TILE * TILE, kLds = TILE + 1;
  __shared__ __align__(16) float a_tile[TILE * kLds];  // [m][k]
  __shared__ __align__(16) float b_tile[TILE * kLds];  // [k][n]
  TileLoader<decltype(g.a), true, TILE, TILE, kLds, kThreads, 1> load_a;
  TileLoader<decltype(g.b), false, TILE, TILE, kLds, kThreads, 1> load_b;

  const int2 tile = tile_origin<TILE, TILE>(g);
  const int row = threadIdx.x / TILE, col = threadIdx.x % TILE;
  float acc = 0.0f;
  for (int t = 0; t < k_tiles<TILE>(g); ++t) {
    const int k0 = t * TILE;
    stage_tiles(load_a, load_b, g, tile, k0, a_tile, b_tile);
#pragma unroll
    for (int k = 0; k < TILE; ++k) acc = fmaf(a_tile[row * kLds + k], b_tile[k * kLds + col], acc);
    __syncthreads();
  }
  store_row<1>(g, tile.x + row, tile.y + col, &acc);
}

constexpr int kTile = 32;

void tiled(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) {
  MM_VARIANTS_DISPATCH_CUDA_DTYPES(a.scalar_type(), "mm_variants_cuda_tiled", [&] {
    with_gemm<scalar_t>(a, b, out, [&](auto g) {
      tiled_kernel<kTile><<<tile_grid<kTile, kTile>(g), kTile * kTile, 0,
                            c10::cuda::getCurrentCUDAStream()>>>(g);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
}

MM_VARIANTS_REGISTER({"tiled", c10::kCUDA, 3, cuda_dtypes(), &tiled, nullptr, nullptr, "",
                      /*auto_candidate=*/false});

}  // namespace
}  // namespace mm_variants::cuda
