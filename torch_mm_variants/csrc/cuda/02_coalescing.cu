// Rung 2, coalescing: the naive kernel with the thread mapping swapped, threadIdx.x -> column n.
//
// The 32 lanes of a warp now share one row m and take 32 consecutive columns: their loads of A
// are one broadcast, their loads of a row-major B and their stores of out are one contiguous
// 128-byte line each instead of 32 scattered ones. Same arithmetic, a fraction of the memory
// transactions.
//
// Tile: 32 x 32 threads per block, one output element each.
#include "common.cuh"

namespace mm_variants::cuda {
namespace {

constexpr int kTile = 32;

template <typename G>
__global__ void __launch_bounds__(kTile * kTile) coalescing_kernel(G g) {
  const int2 tile = tile_origin<kTile, kTile>(g);
  dot_product(g, tile.x + threadIdx.y, tile.y + threadIdx.x);
}

void coalescing(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) {
  MM_VARIANTS_DISPATCH_CUDA_DTYPES(a.scalar_type(), "mm_variants_cuda_coalescing", [&] {
    with_gemm<scalar_t>(a, b, out, [&](auto g) {
      coalescing_kernel<<<tile_grid<kTile, kTile>(g), dim3(kTile, kTile), 0,
                          c10::cuda::getCurrentCUDAStream()>>>(g);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
}

MM_VARIANTS_REGISTER({"coalescing", c10::kCUDA, 2, cuda_dtypes(), &coalescing, nullptr, nullptr,
                      "", /*auto_candidate=*/false});

}  // namespace
}  // namespace mm_variants::cuda
