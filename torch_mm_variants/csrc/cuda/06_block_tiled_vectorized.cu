// Rung 6, block_tiled_vectorized: rung 5 with its memory accesses widened to 128 bits.
// - Global loads move 16 bytes per thread (4 floats or 8 halves) when both operands are aligned
//   for it; a misaligned view takes the scalar instantiation, chosen at launch.
// - A is stored transposed in shared memory, [k][m] like B's [k][n], so a thread's TM values of
//   A at one k are contiguous and arrive in TM / 4 128-bit loads, like its TN values of B: 4
//   shared-load instructions per 64 FMAs instead of 16.
// - out is written 4 elements per store.
//
// Shared rows are padded by 4 floats (16 bytes): the vectors stay aligned, and the copy that
// transposes a row-major A spreads each warp's stores over all 32 banks at BK = 8.
// Tiles: BM = BN = 128, BK = 8, TM = TN = 8; 256 threads.
#include "common.cuh"

namespace mm_variants::cuda {
namespace {

template <int BM, int BN, int BK, int TM, int TN, int VEC, typename G>
__global__ void __launch_bounds__(BM / TM * (BN / TN)) block_tiled_vectorized_kernel(G g) {
  constexpr int kThreads = BM / TM * (BN / TN), kLda = BM + 4, kLdb = BN + 4;
  static_assert(TM % 4 == 0 && TN % 4 == 0, "thread tiles are read in float4s");
  __shared__ __align__(16) float a_tile[BK * kLda];  // [k][m]
  __shared__ __align__(16) float b_tile[BK * kLdb];  // [k][n]
  TileLoader<decltype(g.a), false, BM, BK, kLda, kThreads, VEC> load_a;
  TileLoader<decltype(g.b), false, BN, BK, kLdb, kThreads, VEC> load_b;

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
      for (int i = 0; i < TM; i += 4) load4(&a_frag[i], &a_tile[k * kLda + row0 + i]);
#pragma unroll
      for (int j = 0; j < TN; j += 4) load4(&b_frag[j], &b_tile[k * kLdb + col0 + j]);
      outer_product_acc(acc, a_frag, b_frag);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < TM; ++i) {
#pragma unroll
    for (int j = 0; j < TN; j += 4) store_row<4>(g, tile.x + row0 + i, tile.y + col0 + j, &acc[i][j]);
  }
}

constexpr int kBM = 128, kBN = 128, kBK = 8, kTM = 8, kTN = 8;

void block_tiled_vectorized(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) {
  MM_VARIANTS_DISPATCH_CUDA_DTYPES(a.scalar_type(), "mm_variants_cuda_block_tiled_vectorized", [&] {
    with_gemm<scalar_t>(a, b, out, [&](auto g) {
      with_vector_width(g, [&](auto vec) {
        block_tiled_vectorized_kernel<kBM, kBN, kBK, kTM, kTN, decltype(vec)::value>
            <<<tile_grid<kBM, kBN>(g), kBM / kTM * (kBN / kTN), 0,
               c10::cuda::getCurrentCUDAStream()>>>(g);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      });
    });
  });
}

MM_VARIANTS_REGISTER({"block_tiled_vectorized", c10::kCUDA, 6, cuda_dtypes(),
                      &block_tiled_vectorized, nullptr, nullptr, "", /*auto_candidate=*/false});

}  // namespace
}  // namespace mm_variants::cuda
