// Rung 1, naive: one thread per output element, each computing its whole dot product straight
// from global memory (dot_product in common.cuh).
//
// Threads are mapped the way the loops are written, threadIdx.x -> row m: the 32 lanes of a warp
// take 32 different rows, so for a row-major A each load of a warp touches 32 cache lines, and
// the stores of out are 32-way scattered too. Every later rung starts from this.
//
// Tile: 32 x 32 threads per block, one output element each.
#include "common.cuh"

namespace mm_variants::cuda {
namespace {

constexpr int kTile = 32;

template <typename G>
__global__ void __launch_bounds__(kTile * kTile) naive_kernel(G g) {
  const int2 tile = tile_origin<kTile, kTile>(g);
  dot_product(g, tile.x + threadIdx.x, tile.y + threadIdx.y);
}

void naive(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) {
  MM_VARIANTS_DISPATCH_CUDA_DTYPES(a.scalar_type(), "mm_variants_cuda_naive", [&] {
    with_gemm<scalar_t>(a, b, out, [&](auto g) {
      naive_kernel<<<tile_grid<kTile, kTile>(g), dim3(kTile, kTile), 0,
                     c10::cuda::getCurrentCUDAStream()>>>(g);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
}

MM_VARIANTS_REGISTER({"naive", c10::kCUDA, 1, cuda_dtypes(), &naive, nullptr, nullptr, "",
                      /*auto_candidate=*/false});

}  // namespace
}  // namespace mm_variants::cuda
