// Rung 5, block_tiled: 2-D register tiling. Each thread computes a TM x TN block of outputs: per
// k it loads TM values of A and TN values of B into registers and does TM * TN multiply-adds
// with them (outer_product_acc), 16 shared loads for 64 FMAs at 8 x 8 instead of rung 4's 9 for
// 8. The 128 x 128 block tile halves the global loads per FMA again.
//
// Shared tiles: A as [m][k] (rows padded to BK + 1) and B as [k][n] (rows padded by 4 floats).
// Tiles: BM = BN = 128, BK = 8, TM = TN = 8; (BM / TM) * (BN / TN) = 256 threads.
#include "common.cuh"

namespace mm_variants::cuda {
namespace {

template <int BM, int BN, int BK, int TM, int TN, typename G>
__global__ void __launch_bounds__(BM / TM * (BN / TN)) block_tiled_kernel(G g) {
  constexpr int kThreads = BM / TM * (BN / TN), kLda = BK + 1, kLdb = BN + 4;
  __shared__ __align__(16) float a_tile[BM * kLda];  // [m][k]
  __shared__ __align__(16) float b_tile[BK * kLdb];  // [k][n]
  TileLoader<decltype(g.a), true, BM, BK, kLda, kThreads, 1> load_a;
  TileLoader<decltype(g.b), false, BN, BK, kLdb, kThreads, 1> load_b;

  const int2 tile = tile_origin<BM, BN>(g);
  const int row0 = threadIdx.x / (BN / TN) * TM, col0 = threadIdx.x % (BN / TN) * TN;
  float acc[TM][TN] = {};
  float a_frag[TM], b_frag[TN];
  for (int t = 0; t < k_tiles<BK>(g); ++t) {
    const int k0 = t * BK;
    stage_tiles(load_a, load_b, g, tile, k0, a_tile, b_tile);
#pragma unroll
    for (int k = 0; k < BK; ++k) {
#pragma unroll
      for (int i = 0; i < TM; ++i) a_frag[i] = a_tile[(row0 + i) * kLda + k];
#pragma unroll
      for (int j = 0; j < TN; ++j) b_frag[j] = b_tile[k * kLdb + col0 + j];
      outer_product_acc(acc, a_frag, b_frag);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < TM; ++i) {
#pragma unroll
    for (int j = 0; j < TN; ++j) store_row<1>(g, tile.x + row0 + i, tile.y + col0 + j, &acc[i][j]);
  }
}

constexpr int kBM = 128, kBN = 128, kBK = 8, kTM = 8, kTN = 8;

void block_tiled(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) {
  MM_VARIANTS_DISPATCH_CUDA_DTYPES(a.scalar_type(), "mm_variants_cuda_block_tiled", [&] {
    with_gemm<scalar_t>(a, b, out, [&](auto g) {
      block_tiled_kernel<kBM, kBN, kBK, kTM, kTN>
          <<<tile_grid<kBM, kBN>(g), kBM / kTM * (kBN / kTN), 0,
             c10::cuda::getCurrentCUDAStream()>>>(g);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
}

MM_VARIANTS_REGISTER({"block_tiled", c10::kCUDA, 5, cuda_dtypes(), &block_tiled, nullptr, nullptr,
                      "", /*auto_candidate=*/false});

}  // namespace
}  // namespace mm_variants::cuda
