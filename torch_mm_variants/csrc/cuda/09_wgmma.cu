// Rung 9, wgmma: the Hopper (sm_90a) kernel. Rung 8 keeps every warp busy with address math,
// cp.async issue, ldmatrix and 16x8 mma.sync; here each of those jobs moves to hardware built
// for it, and the warps are split by role.
//
// - TMA: one thread copies a whole 2-D tile per instruction (cp.async.bulk.tensor), swizzled
//   (128-byte pattern) on its way into shared memory so that the tensor cores read it without
//   bank conflicts. Edges come back zero-filled: no predicates, no tails in the main loop.
// - wgmma: a warpgroup (4 warps) multiplies a 64 x 256 tile by 16 of K per instruction, both
//   operands read from shared memory through descriptors, float accumulators in registers. No
//   fragments are loaded: the registers are free for 128 accumulators per thread. The
//   instruction's transpose bits read M- or N-contiguous tiles, so all four operand layouts run in
//   place (A row-major or a.t(); B as [K, N] or an nn.Linear weight's w.t()).
// - Warp specialization: one producer warpgroup issues the copies into a kStages-deep ring and
//   two consumer warpgroups (64 rows each of a 128 x 256 block tile) issue the wgmmas. mbarriers
//   carry "stage full" (TMA transaction bytes) and "stage free" (one arrival per consumer warp).
//   setmaxnreg moves registers from the producer, which needs few, to the consumers.
// - Persistent grid: one block per SM walks output tiles in grouped order (grouped_tile), so the
//   producer loads the next tile's stages while the consumers store the previous one.
//
// Tile parameters: BM x BN = 128 x 256, BK = 64 (one 128-byte swizzle row of 16-bit elements),
// kStages = 4 (48 KB each). fp16 and bf16 only, float32 accumulation; the output is written in
// the input dtype straight from the accumulators.
//
// TMA needs 16-byte aligned base addresses and leading dimensions: other views take rung 8's
// kernel instead. The kernel exists only in the sm_90a build (-gencode arch=compute_90a,
// code=sm_90a) and is listed only on compute capability 9.0 devices.
#include "common.cuh"
#include "hopper.cuh"

#include <cuda.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <cstdint>
#include <mutex>

namespace mm_variants::cuda {
namespace {

constexpr int BM = 128, BN = 256, BK = 64, kStages = 4, kGroupM = 8;
constexpr int kConsumers = 2;                       // warpgroups of 64 x BN each
constexpr int kThreads = 128 * (1 + kConsumers);    // the producer warpgroup comes first
constexpr int kATile = BM * BK, kBTile = BN * BK;   // elements of one stage
constexpr int kStageBytes = (kATile + kBTile) * 2;  // what TMA delivers to a stage
constexpr int kBox = 64;                            // 128 bytes: the swizzle row
constexpr int kBoxBytes = kBox * kBox * 2;          // a 64 x 64 box, 8 KB
constexpr int kSmemBytes = kStages * kStageBytes + 2 * kStages * 8 + 1024;  // + alignment slack
static_assert(BK == kBox && BM == kConsumers * 64, "one swizzle row of K, 64 rows per consumer");

// Registers per thread after setmaxnreg: 128 accumulators plus addressing for the consumers, the
// minimum for the producer; 128 * 40 + 256 * 232 fits the SM's 64K.
constexpr int kProducerRegs = 40, kConsumerRegs = 232;

// Output tiles of an M x N product; the host checks that it fits an int.
__host__ __device__ __forceinline__ int64_t tile_count(int64_t M, int64_t N) {
  return ((M - 1) / BM + 1) * ((N - 1) / BN + 1);
}

// Where a stage's tiles live and how a k16 step of them is described to wgmma (hopper.cuh).
// kKMajor: K is the contiguous dimension of the tile.
template <bool kKMajor>
__device__ __forceinline__ uint64_t step_descriptor(const uint16_t* tile, int k16) {
  if constexpr (kKMajor) return hopper::smem_descriptor(tile + 16 * k16, 16, 1024);
  return hopper::smem_descriptor(tile + 16 * kBox * k16, kBoxBytes, 1024);
}

// The producer thread: for each tile and K step, waits for the stage to be free, then copies A
// (BM x BK) and B (BN x BK) into it. K-major tiles are one box of 64 x rows; M/N-major tiles are
// 64 x 64 boxes side by side, kBoxBytes apart (the descriptors' leading offset).
template <bool kAK, bool kBK>
__device__ void produce(const CUtensorMap* a_map, const CUtensorMap* b_map, uint16_t* a_tiles,
                        uint16_t* b_tiles, uint64_t* full, uint64_t* empty, int M, int N, int K) {
  const int tiles = tile_count(M, N), k_steps = (K - 1) / BK + 1;
  int it = 0;
  for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int2 origin = grouped_tile<BM, BN, kGroupM>(t, M, N);
    for (int ks = 0; ks < k_steps; ++ks, ++it) {
      const int s = it % kStages, k0 = ks * BK;
      hopper::mbarrier_wait(&empty[s], ((it / kStages) & 1) ^ 1);
      hopper::mbarrier_arrive_expect_tx(&full[s], kStageBytes);
      uint16_t* a = a_tiles + s * kATile;
      uint16_t* b = b_tiles + s * kBTile;
      if constexpr (kAK) {
        hopper::tma_load_2d(a, a_map, &full[s], k0, origin.x);
      } else {
#pragma unroll
        for (int j = 0; j < BM / kBox; ++j)
          hopper::tma_load_2d(a + j * kBox * kBox, a_map, &full[s], origin.x + j * kBox, k0);
      }
      if constexpr (kBK) {
        hopper::tma_load_2d(b, b_map, &full[s], k0, origin.y);
      } else {
#pragma unroll
        for (int j = 0; j < BN / kBox; ++j)
          hopper::tma_load_2d(b + j * kBox * kBox, b_map, &full[s], origin.y + j * kBox, k0);
      }
    }
  }
}

// Writes a consumer's 64 x BN accumulators to C in T, two columns per store where N allows it.
template <typename T>
__device__ __forceinline__ void store_tile(const float (&acc)[128], T* c, int M, int N, int row0,
                                           int col0) {
  const int lane = threadIdx.x % 32;
  const int row = row0 + 16 * (threadIdx.x / 32 % 4) + lane / 4;
  const bool pairs = N % 2 == 0;  // C rows then start 4-byte aligned
#pragma unroll
  for (int j = 0; j < BN / 8; ++j) {
    const int col = col0 + 8 * j + 2 * (lane % 4);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int m = row + 8 * h;
      if (m >= M || col >= N) continue;
      T* dst = c + static_cast<int64_t>(m) * N + col;
      const float x = acc[4 * j + 2 * h], y = acc[4 * j + 2 * h + 1];
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

// A consumer warpgroup: for each tile, 4 wgmmas per stage into its 64 rows, at most one group
// in flight; a stage is handed back once the group that read it has completed.
template <typename T, bool kAK, bool kBK>
__device__ void consume(int consumer, uint16_t* a_tiles, uint16_t* b_tiles, uint64_t* full,
                        uint64_t* empty, T* c, int M, int N, int K) {
  constexpr bool kBf16 = std::is_same_v<T, c10::BFloat16>;
  const int tiles = tile_count(M, N), k_steps = (K - 1) / BK + 1;
  const bool warp_leader = threadIdx.x % 32 == 0;
  float acc[128];
  int it = 0;
  for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int2 origin = grouped_tile<BM, BN, kGroupM>(t, M, N);
    int previous = 0;
    for (int ks = 0; ks < k_steps; ++ks, ++it) {
      const int s = it % kStages;
      hopper::mbarrier_wait(&full[s], (it / kStages) & 1);
      const uint16_t* a = a_tiles + s * kATile + consumer * 64 * BK;
      const uint16_t* b = b_tiles + s * kBTile;
      hopper::fence_registers(acc);
      hopper::wgmma_fence();
#pragma unroll
      for (int k16 = 0; k16 < BK / 16; ++k16) {
        hopper::wgmma_m64n256k16<kBf16, !kAK, !kBK>(acc, step_descriptor<kAK>(a, k16),
                                                     step_descriptor<kBK>(b, k16),
                                                     ks > 0 || k16 > 0);
      }
      hopper::wgmma_commit();
      hopper::wgmma_wait<1>();
      hopper::fence_registers(acc);
      if (ks > 0 && warp_leader) hopper::mbarrier_arrive(&empty[previous]);
      previous = s;
    }
    hopper::wgmma_wait<0>();
    hopper::fence_registers(acc);
    if (warp_leader) hopper::mbarrier_arrive(&empty[previous]);
    store_tile(acc, c, M, N, origin.x + consumer * 64, origin.y);
  }
}

template <typename T, bool kAK, bool kBK>
__global__ void __launch_bounds__(kThreads, 1)
    wgmma_kernel(const __grid_constant__ CUtensorMap a_map,
                 const __grid_constant__ CUtensorMap b_map, T* c, int M, int N, int K) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ uint8_t smem_raw[];
  // 128-byte swizzled tiles must start on 1024-byte boundaries (the swizzle atom).
  uint8_t* smem = reinterpret_cast<uint8_t*>(
      (reinterpret_cast<uintptr_t>(smem_raw) + 1023) / 1024 * 1024);
  uint16_t* a_tiles = reinterpret_cast<uint16_t*>(smem);
  uint16_t* b_tiles = a_tiles + kStages * kATile;
  uint64_t* full = reinterpret_cast<uint64_t*>(b_tiles + kStages * kBTile);
  uint64_t* empty = full + kStages;
  if (threadIdx.x == 0) {
    hopper::prefetch_tensor_map(&a_map);
    hopper::prefetch_tensor_map(&b_map);
    for (int s = 0; s < kStages; ++s) {
      hopper::mbarrier_init(&full[s], 1);
      hopper::mbarrier_init(&empty[s], kConsumers * 4);
    }
    hopper::fence_barrier_init();
  }
  __syncthreads();

  const int warpgroup = threadIdx.x / 128;
  if (warpgroup == 0) {
    hopper::setmaxnreg_dec<kProducerRegs>();
    if (threadIdx.x == 0) produce<kAK, kBK>(&a_map, &b_map, a_tiles, b_tiles, full, empty, M, N, K);
  } else {
    hopper::setmaxnreg_inc<kConsumerRegs>();
    consume<T, kAK, kBK>(warpgroup - 1, a_tiles, b_tiles, full, empty, c, M, N, K);
  }
#endif
}

// ---- Host side --------------------------------------------------------------------------------

// cuTensorMapEncodeTiled lives in the driver library; the runtime hands out its address, so the
// extension needs no link against libcuda.
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found;
    C10_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000,
                                                    cudaEnableDefault, &found));
    TORCH_CHECK(found == cudaDriverEntryPointSuccess && fn != nullptr,
                "mm_variants::matmul: the CUDA driver does not provide cuTensorMapEncodeTiled");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  return encode;
}

// A 2-D tensor map over a matrix whose contiguous dimension has `inner` elements and whose
// `outer` lines are `ld` elements apart, copied in boxes of kBox x box_outer with the 128-byte
// swizzle. Reads outside the matrix return zeros.
template <typename T>
CUtensorMap tile_map(const T* data, int64_t inner, int64_t outer, int64_t ld, int box_outer) {
  constexpr CUtensorMapDataType kType = std::is_same_v<T, c10::BFloat16>
                                            ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                            : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  CUtensorMap map;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(inner), static_cast<cuuint64_t>(outer)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(ld) * sizeof(T)};
  const cuuint32_t box[2] = {kBox, static_cast<cuuint32_t>(box_outer)};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUresult result = tensor_map_encoder()(
      &map, kType, 2, const_cast<T*>(data), dims, strides, box, element_strides,
      CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  TORCH_CHECK(result == CUDA_SUCCESS, "mm_variants::matmul: wgmma could not describe a ", outer,
              "x", inner, " operand to TMA (CUresult ", static_cast<int>(result), ")");
  return map;
}

// The operand's tiles as the kernel expects them: K-major ones in one box of BK x rows per stage,
// M/N-major ones in 64 x 64 boxes.
template <class P>
CUtensorMap operand_map(const P& p, int64_t x_extent, int64_t K, int rows) {
  return P::k_contiguous ? tile_map(p.data, K, x_extent, p.ld, rows)
                         : tile_map(p.data, x_extent, K, p.ld, kBox);
}

template <class G>
void launch(const G& g) {
  using T = typename G::scalar;
  constexpr bool kAK = decltype(G::a)::k_contiguous, kBK = decltype(G::b)::k_contiguous;
  const CUtensorMap a_map = operand_map(g.a, g.M, g.K, BM);
  const CUtensorMap b_map = operand_map(g.b, g.N, g.K, BN);
  auto* kernel = wgmma_kernel<T, kAK, kBK>;
  allow_dynamic_smem(kernel, kSmemBytes);
  const int64_t tiles = tile_count(g.M, g.N);
  TORCH_CHECK(tiles <= INT_MAX, "mm_variants::matmul: output ", g.M, "x", g.N,
              " has too many tiles for one grid");
  const int sms = device_properties(c10::cuda::current_device()).multiProcessorCount;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(tiles, sms));
  kernel<<<blocks, kThreads, kSmemBytes, c10::cuda::getCurrentCUDAStream()>>>(a_map, b_map, g.c,
                                                                            g.M, g.N, g.K);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename T>
void wgmma_typed(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) {
  with_gemm<T>(a, b, out, [&](auto g) {
    if (g.a.aligned(16) && g.b.aligned(16)) {
      launch(g);
    } else {  // TMA cannot address the operand
      find_algorithm(a.device(), "tensor_core").run(a, b, out);
    }
  });
}

void wgmma(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) {
  if (a.scalar_type() == at::kBFloat16) {
    wgmma_typed<c10::BFloat16>(a, b, out);
  } else {
    wgmma_typed<c10::Half>(a, b, out);
  }
}

bool sm90a(c10::Device device) {
#if defined(MM_VARIANTS_WITH_SM90A)
  const int count = c10::cuda::device_count();
  if (count == 0) return false;
  const int index = device.has_index() ? device.index() : c10::cuda::current_device();
  if (index >= count) return false;
  const DeviceInfo& info = device_properties(index);
  return info.major == 9 && info.minor == 0;
#else
  (void)device;
  return false;
#endif
}

MM_VARIANTS_REGISTER({"wgmma", c10::kCUDA, 9, {at::kHalf, at::kBFloat16}, &wgmma, &sm90a});

}  // namespace
}  // namespace mm_variants::cuda
