// Rung 9, wgmma: the Hopper (sm_90a) kernel. Rung 8 keeps every warp busy with address math,
// cp.async issue, ldmatrix and 16x8 mma.sync; here each of those jobs moves to hardware built
// for it, and the warps are split by role.
//
// - TMA: one thread copies a whole 2-D tile per instruction (cp.async.bulk.tensor), swizzled
//   (128-byte pattern) on its way into shared memory so that the tensor cores read it without
//   bank conflicts. Edges come back zero-filled: no predicates, no tails in the main loop.
// - wgmma: a warpgroup (4 warps) multiplies a 64 x BN tile by 16 of K per instruction, both
//   operands read from shared memory through descriptors, float accumulators in registers. No
//   fragments are loaded: the registers are free for BN / 2 accumulators per thread. The
//   instruction's transpose bits read M- or N-contiguous tiles, so all four operand layouts run in
//   place (A row-major or a.t(); B as [K, N] or an nn.Linear weight's w.t()).
// - Warp specialization: one producer warpgroup issues the copies into a kStages-deep ring and
//   two consumer warpgroups (64 rows each of a 128 x 256 block tile) issue the wgmmas. mbarriers
//   carry "stage full" (TMA transaction bytes) and "stage free" (one arrival per consumer warp).
//   setmaxnreg moves registers from the producer, which needs few, to the consumers.
// - Persistent grid: one block per SM walks output tiles in grouped order (grouped_tile), so the
//   producer loads the next tile's stages while the consumers store the previous one.
// - Clusters: two blocks on neighbouring SMs take the two 128-row halves of a 256 x 256 tile and
//   share its B tile: each copies half of it and TMA multicasts the half into both blocks' shared
//   memory, so a block reads 32 KB of L2 per stage instead of 48. A stage is free again once the
//   consumers of both blocks have read it.
//
// Tile parameters (TileShape): BM x BN = 128 x 256 with 4 stages of BK = 64 (one 128-byte swizzle
// row of 16-bit elements, 48 KB a stage), or 128 x 128 with 6 stages where 256-wide tiles would
// leave SMs idle. fp16 and bf16 only, float32 accumulation. The epilogue converts the
// accumulators to the input dtype into a swizzled staging buffer and stores it with TMA, so the
// consumers start the next tile while the copy engine writes the last one.
//
// TMA needs 16-byte aligned base addresses and leading dimensions: other views take rung 8's
// kernel instead. The kernel exists only in the sm_90a build (-gencode arch=compute_90a,
// code=sm_90a) and is listed only on compute capability 9.0 devices.
#include "common.cuh"
#include "epilogue.cuh"
#include "hopper.cuh"
#include "tensor_map.cuh"

#include <algorithm>
#include <cstdint>

namespace mm_variants::cuda {
namespace {

constexpr int BM = 128, BK = 64;
[[maybe_unused]] constexpr int kGroupM = 16;  // tile rows per group of the grouped tile order
constexpr int kConsumers = 2;                      // warpgroups of 64 x BN each
constexpr int kThreads = 128 * (1 + kConsumers);   // the producer warpgroup comes first
constexpr int kATile = BM * BK;                    // elements of A in one stage
constexpr int kBox = kTmaBoxInner;                 // 128 bytes: the swizzle row
[[maybe_unused]] constexpr int kBoxBytes = kBox * kBox * 2;  // a 64 x 64 box, 8 KB
// The epilogue stages a consumer's tile in rounds of kStoreCols columns: 64 x 64 boxes, 8 KB.
constexpr int kStoreCols = 128, kStaging = 64 * kStoreCols;
static_assert(BK == kBox && BM == kConsumers * 64, "one swizzle row of K, 64 rows per consumer");

// The block tile, BM x BN, and the stages of its ring. Wide tiles read the least L2 per
// multiply-add; narrow ones, with more stages in the same shared memory, keep every SM busy on
// outputs that have too few wide tiles (e.g. 2048 x 1024).
template <int BN_, int STAGES>
struct TileShape {
  static constexpr int BN = BN_, kStages = STAGES;
  static constexpr int kBTile = BN * BK;                 // elements of B in one stage
  static constexpr int kStageBytes = (kATile + kBTile) * 2;  // what TMA delivers to a stage
  static constexpr int kAccumulators = BN / 2;           // per consumer thread
  static constexpr int kSmemBytes =
      kStages * kStageBytes + kConsumers * kStaging * 2 + 2 * kStages * 8 + 1024;  // + alignment
  static_assert(BN % kStoreCols == 0 && kAccumulators <= 128 && kSmemBytes <= 227 * 1024,
                "fits one SM and its registers");
};
using WideTile = TileShape<256, 4>;
using NarrowTile = TileShape<128, 6>;

// Registers per thread after setmaxnreg: up to 128 accumulators plus addressing for the
// consumers, the minimum for the producer; 128 * 40 + 256 * 232 fits the SM's 64K.
[[maybe_unused]] constexpr int kProducerRegs = 40, kConsumerRegs = 232;

// Output tiles of an M x N product, counting kCluster tiles stacked along M as one; the host
// checks that the count fits an int.
template <class S, int kCluster = 1>
__host__ __device__ __forceinline__ int64_t tile_count(int64_t M, int64_t N) {
  return ((M - 1) / (kCluster * BM) + 1) * ((N - 1) / S::BN + 1);
}

// Where a stage's tiles live and how a k16 step of them is described to wgmma (hopper.cuh).
// kKMajor: K is the contiguous dimension of the tile.
template <bool kKMajor>
__device__ __forceinline__ uint64_t step_descriptor(const uint16_t* tile, int k16) {
  if constexpr (kKMajor) return hopper::smem_descriptor(tile + 16 * k16, 16, 1024);
  return hopper::smem_descriptor(tile + 16 * kBox * k16, kBoxBytes, 1024);
}

// The tiles of a persistent block: every gridDim.x / kCluster-th cluster tile from its cluster's
// index. A cluster tile is kCluster block tiles stacked along M that share their B tile; each
// block of the cluster takes one of them (its rank).
template <class S, int kCluster>
struct TileWalk {
  int cluster_tiles, M, N;

  __device__ __forceinline__ TileWalk(int M_, int N_)
      : cluster_tiles(static_cast<int>(tile_count<S, kCluster>(M_, N_))), M(M_), N(N_) {}
  __device__ __forceinline__ int first() const { return blockIdx.x / kCluster; }
  __device__ __forceinline__ int stride() const { return gridDim.x / kCluster; }
  // The block's output origin (first row, first column) in cluster tile t.
  __device__ __forceinline__ int2 origin(int t, int rank) const {
    const int2 o = grouped_tile<kCluster * BM, S::BN, kGroupM / kCluster>(t, M, N);
    return make_int2(o.x + rank * BM, o.y);
  }
};

// The producer thread: for each tile and K step, waits until the stage is free in every block of
// the cluster, then copies A (BM x BK) into its own block and its 1 / kCluster share of B
// (BN x BK) into every block of the cluster. K-major tiles are boxes of 64 x rows; M/N-major
// tiles are 64 x 64 boxes side by side, kBoxBytes apart (the descriptors' leading offset).
template <class S, bool kAK, bool kBK, int kCluster>
__device__ void produce(const CUtensorMap* a_map, const CUtensorMap* b_map, uint16_t* a_tiles,
                        uint16_t* b_tiles, uint64_t* full, uint64_t* empty, int M, int N, int K,
                        int rank) {
  const TileWalk<S, kCluster> walk(M, N);
  const int k_steps = (K - 1) / BK + 1;
  constexpr uint16_t kAllCtas = (1u << kCluster) - 1;
  const auto load_b = [&](uint16_t* dst, uint64_t* bar, int c0, int c1) {
    if constexpr (kCluster == 1) {
      hopper::tma_load_2d(dst, b_map, bar, c0, c1);
    } else {
      hopper::tma_load_2d_multicast(dst, b_map, bar, c0, c1, kAllCtas);
    }
  };
  int it = 0;
  for (int t = walk.first(); t < walk.cluster_tiles; t += walk.stride()) {
    const int2 origin = walk.origin(t, rank);
    const int n0 = origin.y;
    for (int ks = 0; ks < k_steps; ++ks, ++it) {
      const int s = it % S::kStages, k0 = ks * BK;
      hopper::mbarrier_wait(&empty[s], ((it / S::kStages) & 1) ^ 1);
      hopper::mbarrier_arrive_expect_tx(&full[s], S::kStageBytes);
      uint16_t* a = a_tiles + s * kATile;
      uint16_t* b = b_tiles + s * S::kBTile;
      if constexpr (kAK) {
        hopper::tma_load_2d(a, a_map, &full[s], k0, origin.x);
      } else {
#pragma unroll
        for (int j = 0; j < BM / kBox; ++j)
          hopper::tma_load_2d(a + j * kBox * kBox, a_map, &full[s], origin.x + j * kBox, k0);
      }
      if constexpr (kBK) {  // this block's BN / kCluster rows of the tile
        constexpr int kRows = S::BN / kCluster;
        load_b(b + rank * kRows * kBox, &full[s], k0, n0 + rank * kRows);
      } else {  // this block's boxes of the tile
#pragma unroll
        for (int j = 0; j < S::BN / kBox / kCluster; ++j) {
          const int box = j * kCluster + rank;
          load_b(b + box * kBox * kBox, &full[s], n0 + box * kBox, k0);
        }
      }
    }
  }
}

// Writes a consumer's 64 x BN accumulators to C in T, two columns per store where N allows it:
// the epilogue for outputs that TMA cannot address (N not a multiple of 8).
template <class S, typename T, class Epi>
__device__ __forceinline__ void store_tile(const float (&acc)[S::kAccumulators], const Epi& epi,
                                           T* c, int M, int N, int row0, int col0) {
  const int lane = threadIdx.x % 32;
  const int row = row0 + 16 * (threadIdx.x / 32 % 4) + lane / 4;
  const bool pairs = N % 2 == 0;  // C rows then start 4-byte aligned
#pragma unroll
  for (int j = 0; j < S::BN / 8; ++j) {
    const int col = col0 + 8 * j + 2 * (lane % 4);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int m = row + 8 * h;
      if (m >= M || col >= N) continue;
      T* dst = c + static_cast<int64_t>(m) * N + col;
      const float x = epi(acc[4 * j + 2 * h], col), y = epi(acc[4 * j + 2 * h + 1], col + 1);
      if (pairs) {
        Vec<T, 2> v;
        v.v[0] = static_cast<T>(x);
        v.v[1] = static_cast<T>(y);
        *reinterpret_cast<Vec<T, 2>*>(dst) = v;
      } else {
        dst[0] = static_cast<T>(x);
        if (col + 1 < N) dst[1] = static_cast<T>(y);
      }
    }
  }
}

// The epilogue for the rest: the warpgroup writes kStoreCols columns of its accumulators into its
// staging buffer, as 64 x 64 boxes with the 128-byte swizzle the copies use (conflict-free: the
// 8 rows of a warp's store land in 8 different 16-byte chunks), and one thread hands the boxes to
// TMA, which stores them (clipped at the matrix edges) while the warpgroup moves on. Before a
// buffer is refilled, the stores that read it must have done so.
template <class S, typename T, class Epi>
__device__ __forceinline__ void store_tile_async(const float (&acc)[S::kAccumulators],
                                                 const Epi& epi, uint16_t* staging,
                                                 const CUtensorMap* c_map, int consumer, int row0,
                                                 int col0) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32 % 4;
  const bool issuer = threadIdx.x % 128 == 0;
  const int barrier = 1 + consumer;
#pragma unroll
  for (int round = 0; round < S::BN / kStoreCols; ++round) {
    if (issuer) hopper::tma_store_wait<true>();
    hopper::named_barrier_sync(barrier, 128);
#pragma unroll
    for (int jj = 0; jj < kStoreCols / 8; ++jj) {
      const int j = round * (kStoreCols / 8) + jj;
      uint8_t* box = reinterpret_cast<uint8_t*>(staging + jj / 8 * kBox * kBox);
      const int col = col0 + round * kStoreCols + 8 * jj + 2 * (lane % 4);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = 16 * warp + lane / 4 + 8 * h;
        Vec<T, 2> v;
        v.v[0] = static_cast<T>(epi(acc[4 * j + 2 * h], col));
        v.v[1] = static_cast<T>(epi(acc[4 * j + 2 * h + 1], col + 1));
        *reinterpret_cast<Vec<T, 2>*>(box + row * 128 + ((jj % 8) ^ (row % 8)) * 16 +
                                      lane % 4 * 4) = v;
      }
    }
    hopper::fence_async_shared();
    hopper::named_barrier_sync(barrier, 128);
    if (issuer) {
#pragma unroll
      for (int b = 0; b < kStoreCols / kBox; ++b) {
        hopper::tma_store_2d(c_map, staging + b * kBox * kBox, col0 + round * kStoreCols + b * kBox,
                             row0);
      }
      hopper::tma_store_commit();
    }
  }
}

// Hands stage `bar` back: each consumer warp arrives on it in every block of the cluster, since
// every block's producer writes into this block's copy of the stage.
template <int kCluster>
__device__ __forceinline__ void release_stage(uint64_t* bar) {
  if constexpr (kCluster == 1) {
    hopper::mbarrier_arrive(bar);
  } else {
#pragma unroll
    for (int cta = 0; cta < kCluster; ++cta) hopper::mbarrier_arrive_cluster(bar, cta);
  }
}

// A consumer warpgroup: for each tile, 4 wgmmas per stage into its 64 rows, at most one group
// in flight; a stage is handed back once the group that read it has completed.
template <class S, typename T, bool kAK, bool kBK, int kCluster, class Epi>
__device__ void consume(int consumer, uint16_t* a_tiles, uint16_t* b_tiles, uint16_t* staging,
                        uint64_t* full, uint64_t* empty, const CUtensorMap* c_map, const Epi& epi,
                        T* c, int M, int N, int K, int rank) {
  constexpr bool kBf16 = std::is_same_v<T, c10::BFloat16>;
  const TileWalk<S, kCluster> walk(M, N);
  const int k_steps = (K - 1) / BK + 1;
  const bool warp_leader = threadIdx.x % 32 == 0;
  float acc[S::kAccumulators];
  int it = 0;
  for (int t = walk.first(); t < walk.cluster_tiles; t += walk.stride()) {
    const int2 origin = walk.origin(t, rank);
    int previous = 0;
    for (int ks = 0; ks < k_steps; ++ks, ++it) {
      const int s = it % S::kStages;
      hopper::mbarrier_wait(&full[s], (it / S::kStages) & 1);
      const uint16_t* a = a_tiles + s * kATile + consumer * 64 * BK;
      const uint16_t* b = b_tiles + s * S::kBTile;
      hopper::fence_registers(acc);
      hopper::wgmma_fence();
#pragma unroll
      for (int k16 = 0; k16 < BK / 16; ++k16) {
        hopper::wgmma_m64k16<S::BN, kBf16, !kAK, !kBK>(acc, step_descriptor<kAK>(a, k16),
                                                        step_descriptor<kBK>(b, k16),
                                                        ks > 0 || k16 > 0);
      }
      hopper::wgmma_commit();
      hopper::wgmma_wait<1>();
      hopper::fence_registers(acc);
      if (ks > 0 && warp_leader) release_stage<kCluster>(&empty[previous]);
      previous = s;
    }
    hopper::wgmma_wait<0>();
    hopper::fence_registers(acc);
    if (warp_leader) release_stage<kCluster>(&empty[previous]);
    if (c_map != nullptr) {
      store_tile_async<S, T>(acc, epi, staging, c_map, consumer, origin.x + consumer * 64,
                             origin.y);
    } else {
      store_tile<S>(acc, epi, c, M, N, origin.x + consumer * 64, origin.y);
    }
  }
  // Shared memory must outlive the stores that read it.
  if (c_map != nullptr && threadIdx.x % 128 == 0) hopper::tma_store_wait<false>();
}

// kCluster: blocks per cluster along M (1 or 2), sharing each B tile through TMA multicast. Epi
// (epilogue.cuh) maps each float32 sum of column n before it is rounded: linear's bias and
// activation, or nothing.
template <class S, typename T, bool kAK, bool kBK, int kCluster, class Epi>
__global__ void __launch_bounds__(kThreads, 1)
    wgmma_kernel(const __grid_constant__ CUtensorMap a_map,
                 const __grid_constant__ CUtensorMap b_map,
                 const __grid_constant__ CUtensorMap c_map, bool tma_store, Epi epi, T* c, int M,
                 int N, int K) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ uint8_t smem_raw[];
  // 128-byte swizzled tiles must start on 1024-byte boundaries (the swizzle atom). The offset is
  // the same in every block, as multicast copies and remote arrivals need.
  uint8_t* smem = reinterpret_cast<uint8_t*>(
      (reinterpret_cast<uintptr_t>(smem_raw) + 1023) / 1024 * 1024);
  uint16_t* a_tiles = reinterpret_cast<uint16_t*>(smem);
  uint16_t* b_tiles = a_tiles + S::kStages * kATile;
  uint16_t* staging = b_tiles + S::kStages * S::kBTile;  // one buffer per consumer
  uint64_t* full = reinterpret_cast<uint64_t*>(staging + kConsumers * kStaging);
  uint64_t* empty = full + S::kStages;
  const int rank = kCluster == 1 ? 0 : static_cast<int>(hopper::cluster_cta_rank());
  if (threadIdx.x == 0) {
    hopper::prefetch_tensor_map(&a_map);
    hopper::prefetch_tensor_map(&b_map);
    if (tma_store) hopper::prefetch_tensor_map(&c_map);
    for (int s = 0; s < S::kStages; ++s) {
      hopper::mbarrier_init(&full[s], 1);
      hopper::mbarrier_init(&empty[s], kCluster * kConsumers * 4);
    }
    hopper::fence_barrier_init();
  }
  // The other blocks of the cluster copy into this one and arrive on its barriers: they may
  // start only once its barriers exist.
  if constexpr (kCluster == 1) {
    __syncthreads();
  } else {
    hopper::cluster_sync();
  }

  const int warpgroup = threadIdx.x / 128;
  if (warpgroup == 0) {
    hopper::setmaxnreg_dec<kProducerRegs>();
    if (threadIdx.x == 0) {
      produce<S, kAK, kBK, kCluster>(&a_map, &b_map, a_tiles, b_tiles, full, empty, M, N, K, rank);
    }
  } else {
    hopper::setmaxnreg_inc<kConsumerRegs>();
    const int consumer = warpgroup - 1;
    consume<S, T, kAK, kBK, kCluster>(consumer, a_tiles, b_tiles, staging + consumer * kStaging,
                                      full, empty, tma_store ? &c_map : nullptr, epi, c, M, N, K,
                                      rank);
  }
  // No block may exit while another block of its cluster can still write into its shared memory.
  if constexpr (kCluster > 1) hopper::cluster_sync();
#endif
}

// ---- Host side --------------------------------------------------------------------------------

// The operand's tiles as the kernel expects them: K-major ones in one box of BK x rows per stage,
// M/N-major ones in 64 x 64 boxes.
template <class P>
CUtensorMap operand_map(const P& p, int64_t x_extent, int64_t K, int rows) {
  return P::k_contiguous ? tile_map(p.data, K, x_extent, p.ld, rows)
                         : tile_map(p.data, x_extent, K, p.ld, kBox);
}

// Clusters of `config`'s shape that fit on the device at once: the persistent grid's size. Asked
// once per kernel and device (the answer depends on how SMs group into GPCs).
template <class Kernel>
int resident_clusters(Kernel* kernel, const cudaLaunchConfig_t& config) {
  return once_per_kernel_and_device(reinterpret_cast<const void*>(kernel), [&] {
    int clusters = 0;
    C10_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&clusters, kernel, &config));
    TORCH_CHECK(clusters > 0, "mm_variants::matmul: wgmma's thread-block clusters do not fit on ",
                device_properties(c10::cuda::current_device()).name);
    return clusters;
  });
}

// Launches the persistent grid: one block per SM (as many clusters as fit), never more blocks
// than tiles.
template <class S, int kCluster, class G, class Epi>
void launch(const G& g, const Epi& epi) {
  using T = typename G::scalar;
  constexpr bool kAK = decltype(G::a)::k_contiguous, kBK = decltype(G::b)::k_contiguous;
  const CUtensorMap a_map = operand_map(g.a, g.M, g.K, BM);
  const CUtensorMap b_map = operand_map(g.b, g.N, g.K, S::BN / kCluster);
  // C rows must start on 16-byte boundaries for TMA to store them.
  const bool tma_store = g.N % (16 / sizeof(T)) == 0;
  const CUtensorMap c_map = tma_store ? tile_map<T>(g.c, g.N, g.M, g.N, kBox) : CUtensorMap{};
  auto* kernel = wgmma_kernel<S, T, kAK, kBK, kCluster, Epi>;
  allow_dynamic_smem(kernel, S::kSmemBytes);
  const int64_t cluster_tiles = tile_count<S, kCluster>(g.M, g.N);
  TORCH_CHECK(cluster_tiles * kCluster <= INT_MAX, "mm_variants::matmul: output ", g.M, "x", g.N,
              " has too many tiles for one grid");

  cudaLaunchAttribute cluster_shape;
  cluster_shape.id = cudaLaunchAttributeClusterDimension;
  cluster_shape.val.clusterDim.x = kCluster;
  cluster_shape.val.clusterDim.y = 1;
  cluster_shape.val.clusterDim.z = 1;
  cudaLaunchConfig_t config = {};
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = S::kSmemBytes;
  config.stream = c10::cuda::getCurrentCUDAStream();
  config.attrs = &cluster_shape;
  config.numAttrs = 1;
  config.gridDim = dim3(kCluster);  // the occupancy query reads the cluster shape from here
  const int64_t clusters = std::min<int64_t>(cluster_tiles, resident_clusters(kernel, config));
  config.gridDim = dim3(static_cast<unsigned>(clusters * kCluster));
  C10_CUDA_CHECK(
      cudaLaunchKernelEx(&config, kernel, a_map, b_map, c_map, tma_store, epi, g.c, g.M, g.N, g.K));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// Pairs of blocks along M share B when there are two tile rows to pair.
template <class S, class G, class Epi>
void launch_tiles(const G& g, const Epi& epi) {
  if (g.M > BM) {
    launch<S, 2>(g, epi);
  } else {
    launch<S, 1>(g, epi);
  }
}

// The share of the SMs' time that `tiles` equal tiles keep busy, run in waves of one per SM.
double wave_efficiency(int64_t tiles, int sms) {
  const int64_t waves = (tiles + sms - 1) / sms;
  return static_cast<double>(tiles) / static_cast<double>(waves * sms);
}

// Wide tiles unless narrow ones fill the SMs enough better to make up for reading more of L2
// per multiply-add (taken as a tenth of their speed).
template <class G, class Epi = NoEpilogue>
void launch(const G& g, const Epi& epi = {}) {
  const int sms = device_properties(c10::cuda::current_device()).multiProcessorCount;
  const double wide = wave_efficiency(tile_count<WideTile>(g.M, g.N), sms);
  const double narrow = wave_efficiency(tile_count<NarrowTile>(g.M, g.N), sms);
  if (0.9 * narrow > wide) {
    launch_tiles<NarrowTile>(g, epi);
  } else {
    launch_tiles<WideTile>(g, epi);
  }
}

// Calls f(gemm) for out = a @ b when TMA can address both operands; other views go to rung 8
// (`fallback(tensor_core)`), never to a copy engine fault.
template <typename F, typename Fallback>
void with_tma_gemm(const at::Tensor& a, const at::Tensor& b, at::Tensor& out, F&& f,
                   Fallback&& fallback) {
  dispatch_16bit(a.scalar_type(), [&](auto dtype) {
    with_gemm<decltype(dtype)>(a, b, out, [&](auto g) {
      if (g.a.aligned(16) && g.b.aligned(16)) {
        f(g);
      } else {
        fallback(find_algorithm(a.device(), "tensor_core"));
      }
    });
  });
}

void wgmma(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) {
  with_tma_gemm(
      a, b, out, [](const auto& g) { launch(g); },
      [&](const Algorithm& rung8) { rung8.run(a, b, out); });
}

// linear's epilogue, fused for the nn.Linear layout (x row-major, w.t() column-major: both
// K-contiguous) when the epilogue is cheap: a bias and relu ride along with the stores for free,
// but erf, tanh and exp on every sum hold up the tensor cores longer than a separate pass over
// the output takes. Otherwise the plain kernel and the epilogue from ATen.
void wgmma_fused(const at::Tensor& a, const at::Tensor& b, const Epilogue& epilogue,
                 at::Tensor& out) {
  const auto fused = [&](const auto& g) {
    using G = std::decay_t<decltype(g)>;
    using T = typename G::scalar;
    constexpr bool kLinearLayout = decltype(G::a)::k_contiguous && decltype(G::b)::k_contiguous;
    const T* bias = epilogue.bias.defined() ? static_cast<const T*>(epilogue.bias.data_ptr())
                                            : nullptr;
    const int columns = epilogue.bias.defined() ? static_cast<int>(epilogue.bias.size(0)) : 0;
    if constexpr (kLinearLayout) {
      if (epilogue.activation == Activation::kNone) {
        return launch(g, BiasActivation<T, Activation::kNone>{bias, columns});
      }
      if (epilogue.activation == Activation::kRelu) {
        return launch(g, BiasActivation<T, Activation::kRelu>{bias, columns});
      }
    }
    launch(g);
    apply_epilogue(epilogue, out);
  };
  with_tma_gemm(a, b, out, fused,
                [&](const Algorithm& rung8) { rung8.run_fused(a, b, epilogue, out); });
}

MM_VARIANTS_REGISTER({"wgmma", c10::kCUDA, 9, {at::kHalf, at::kBFloat16}, &wgmma, &sm90a, nullptr,
                      "", /*auto_candidate=*/true, &wgmma_fused});

}  // namespace
}  // namespace mm_variants::cuda
