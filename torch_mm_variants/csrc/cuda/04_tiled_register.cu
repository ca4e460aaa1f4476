// Rung 4, tiled_register: 1-D register tiling. Each thread computes TM outputs of one column
// instead of one: per k it reads one value of B from shared memory into a register and reuses it
// for TM multiply-adds with TM values of A (a broadcast: the whole warp shares the rows). Shared
// loads per FMA drop from 2 to (TM + 1) / TM, and the 64 x 64 block tile needs half the global
// loads per FMA of rung 3's 32 x 32.
//
// Shared tiles: A as [m][k] (rows padded to BK + 1) and B as [k][n] (rows padded by 4 floats,
// which makes the transposing copy of a column-major B conflict-free at BK = 8).
// Tiles: BM = BN = 64, BK = 8, TM = 8; BM * BN / TM = 512 threads.
#include "common.cuh"

namespace mm_variants::cuda {
namespace {

template <int BM, int BN, int BK, int TM, typename G>
__global__ void __launch_bounds__(BM * BN / TM) tiled_register_kernel(G g) {
  constexpr int kThreads = BM * BN / TM, kLda = BK + 1, kLdb = BN + 4;
  __shared__ __align__(16) float a_tile[BM * kLda];  // [m][k]
  __shared__ __align__(16) float b_tile[BK * kLdb];  // [k][n]
  TileLoader<decltype(g.a), true, BM, BK, kLda, kThreads, 1> load_a;
  TileLoader<decltype(g.b), false, BN, BK, kLdb, kThreads, 1> load_b;

  const int2 tile = tile_origin<BM, BN>(g);
  const int row0 = threadIdx.x / BN * TM, col = threadIdx.x % BN;
  float acc[TM] = {};
  for (int t = 0; t < k_tiles<BK>(g); ++t) {
    const int k0 = t * BK;
    stage_tiles(load_a, load_b, g, tile, k0, a_tile, b_tile);
#pragma unroll
    for (int k = 0; k < BK; ++k) {
      const float b = b_tile[k * kLdb + col];
#pragma unroll
      for (int i = 0; i < TM; ++i) acc[i] = fmaf(a_tile[(row0 + i) * kLda + k], b, acc[i]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < TM; ++i) store_row<1>(g, tile.x + row0 + i, tile.y + col, &acc[i]);
}

constexpr int kBM = 64, kBN = 64, kBK = 8, kTM = 8;

void tiled_register(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) {
  MM_VARIANTS_DISPATCH_CUDA_DTYPES(a.scalar_type(), "mm_variants_cuda_tiled_register", [&] {
    with_gemm<scalar_t>(a, b, out, [&](auto g) {
      tiled_register_kernel<kBM, kBN, kBK, kTM><<<tile_grid<kBM, kBN>(g), kBM * kBN / kTM, 0,
                                                  c10::cuda::getCurrentCUDAStream()>>>(g);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
}

MM_VARIANTS_REGISTER({"tiled_register", c10::kCUDA, 4, cuda_dtypes(), &tiled_register, nullptr,
                      nullptr, "", /*auto_candidate=*/false});

}  // namespace
}  // namespace mm_variants::cuda
