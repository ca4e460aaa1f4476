// Rung 7, warp_tiling: the block tile is split into warp tiles and each warp tile into the
// threads' register tiles (block -> warp -> thread), and global loads overlap the arithmetic.
// - Warp tiles: warp w computes a WM x WN piece of the block tile. Inside it, a thread's TM x TN
//   outputs are 4 x 4 pieces spread 4 * (lanes across) apart, so at each k the lanes of a warp
//   read consecutive float4s of A and of B: conflict-free 128-bit shared loads, where rung 6's
//   contiguous 8-wide thread tiles put lanes 8 floats apart (bank conflicts on B).
// - Double buffering: two shared-memory stages. Before computing on one, each thread issues the
//   global loads of the next k step into registers (TileLoader::load); their latency hides
//   behind the arithmetic, and they go to the other stage afterwards: one __syncthreads per step.
// - The k loop of a step is unrolled, so the compiler hoists the shared loads for k + 1 above
//   the FMAs of k on its own; an explicit second fragment set only cost registers (spills).
// - Grouped tile order (tile_origin, GROUP_M = 8), so resident blocks share A and B in L2.
//
// Tile parameters (WarpTiling): block tile BM x BN x BK, warp tile WM x WN, thread tile TM x TN,
// and the resident blocks per SM that __launch_bounds__ budgets registers for. The defaults,
// 128 x 256 x 8 blocks of 8 warps with 64 x 64 warp tiles and 8 x 16 thread tiles, one block per
// SM, won the sweep of `scripts/tune_tiling.py --rung warp_tiling` (4096^3 float32, H200), which
// predefines MM_VARIANTS_WARP_TILING to try others.
#include "common.cuh"

namespace mm_variants::cuda {
namespace {

template <int BM_, int BN_, int BK_, int WM_, int WN_, int TM_, int TN_, int MIN_BLOCKS_>
struct WarpTiling {
  static constexpr int BM = BM_, BN = BN_, BK = BK_, WM = WM_, WN = WN_, TM = TM_, TN = TN_;
  static constexpr int kMinBlocks = MIN_BLOCKS_;
  static constexpr int kWarpsN = BN / WN, kThreads = BM / WM * kWarpsN * 32;
  static constexpr int kLanesM = WM / TM, kLanesN = WN / TN;  // a warp's lanes over its tile
  static_assert(BM % WM == 0 && BN % WN == 0 && kLanesM * kLanesN == 32,
                "warp tiles must tile the block, thread tiles the warp's 32 lanes");
  static_assert(TM % 4 == 0 && TN % 4 == 0, "thread tiles are made of 4 x 4 pieces");
  // Rows padded by 16 bytes: float4-aligned, and the transposing copy of a row-major A (or a
  // column-major B) spreads a warp's stores over the banks.
  static constexpr int kLda = BM + 4, kLdb = BN + 4;
  static constexpr int kStage = BK * (kLda + kLdb);  // floats: A [k][m], then B [k][n]
  static constexpr int kSmemBytes = 2 * kStage * static_cast<int>(sizeof(float));
};

#ifndef MM_VARIANTS_WARP_TILING  // BM, BN, BK, WM, WN, TM, TN, MIN_BLOCKS
#define MM_VARIANTS_WARP_TILING 128, 256, 8, 64, 64, 8, 16, 1
#endif
using Config = WarpTiling<MM_VARIANTS_WARP_TILING>;

// The scalar-load instantiation (misaligned operands) keeps VEC times more loads in flight, each
// with its own address: it is budgeted for one resident block, so that it never spills.
template <class C, int VEC, typename G>
__global__ void __launch_bounds__(C::kThreads, VEC == 1 ? 1 : C::kMinBlocks)
    warp_tiling_kernel(G g) {
  extern __shared__ float4 smem_vec[];
  float* const smem = reinterpret_cast<float*>(smem_vec);  // two stages of C::kStage floats
  TileLoader<decltype(g.a), false, C::BM, C::BK, C::kLda, C::kThreads, VEC> load_a;
  TileLoader<decltype(g.b), false, C::BN, C::BK, C::kLdb, C::kThreads, VEC> load_b;

  const int2 tile = tile_origin<C::BM, C::BN, 8>(g);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  // The thread's first row and column in the block tile; its 4 x 4 pieces repeat every
  // kRowStep rows and kColStep columns of the warp tile.
  const int row0 = warp / C::kWarpsN * C::WM + lane / C::kLanesN * 4;
  const int col0 = warp % C::kWarpsN * C::WN + lane % C::kLanesN * 4;
  constexpr int kRowStep = 4 * C::kLanesM, kColStep = 4 * C::kLanesN;

  const auto read_fragments = [&](const float* stage, int k, float(&a)[C::TM], float(&b)[C::TN]) {
#pragma unroll
    for (int i = 0; i < C::TM; i += 4) load4(&a[i], stage + k * C::kLda + row0 + i / 4 * kRowStep);
    const float* b_tile = stage + C::BK * C::kLda;
#pragma unroll
    for (int j = 0; j < C::TN; j += 4) load4(&b[j], b_tile + k * C::kLdb + col0 + j / 4 * kColStep);
  };
  const auto load_step = [&](int step) {
    load_a.load(g.a, tile.x, step * C::BK, g.M, g.K);
    load_b.load(g.b, tile.y, step * C::BK, g.N, g.K);
  };
  const auto store_step = [&](float* stage) {
    load_a.store(stage);
    load_b.store(stage + C::BK * C::kLda);
  };

  float acc[C::TM][C::TN] = {};
  float a_frag[C::TM], b_frag[C::TN];

  const int steps = (g.K - 1) / C::BK + 1;
  load_step(0);
  store_step(smem);
  __syncthreads();
  for (int step = 0; step < steps; ++step) {
    const float* stage = smem + (step % 2) * C::kStage;
    const bool more = step + 1 < steps;
    if (more) load_step(step + 1);
#pragma unroll
    for (int k = 0; k < C::BK; ++k) {
      read_fragments(stage, k, a_frag, b_frag);
      outer_product_acc(acc, a_frag, b_frag);
    }
    if (more) {
      // The other stage was last read in step - 1, before the barrier that closed it.
      float* next = smem + ((step + 1) % 2) * C::kStage;
      store_step(next);
      __syncthreads();
    }
  }

#pragma unroll
  for (int i = 0; i < C::TM; ++i) {
    const int m = tile.x + row0 + i / 4 * kRowStep + i % 4;
#pragma unroll
    for (int j = 0; j < C::TN; j += 4) {
      store_row<4>(g, m, tile.y + col0 + j / 4 * kColStep, &acc[i][j]);
    }
  }
}

void warp_tiling(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) {
  MM_VARIANTS_DISPATCH_CUDA_DTYPES(a.scalar_type(), "mm_variants_cuda_warp_tiling", [&] {
    with_gemm<scalar_t>(a, b, out, [&](auto g) {
      with_vector_width(g, [&](auto vec) {
        auto* kernel = warp_tiling_kernel<Config, decltype(vec)::value, decltype(g)>;
        allow_dynamic_smem(kernel, Config::kSmemBytes);
        kernel<<<tile_grid<Config::BM, Config::BN>(g), Config::kThreads, Config::kSmemBytes,
                 c10::cuda::getCurrentCUDAStream()>>>(g);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      });
    });
  });
}

MM_VARIANTS_REGISTER({"warp_tiling", c10::kCUDA, 7, cuda_dtypes(), &warp_tiling});

}  // namespace
}  // namespace mm_variants::cuda
