// The ceiling of rung 8's instruction on this GPU: bf16 mma.sync m16n8k16 throughput with no
// global-memory traffic, for the warp tiling rung 8 uses (8 warps of 64 x 64 over a 128 x 256
// tile, one block per SM) and a few others, then the same loop with its fragments read from shared
// memory by ldmatrix and a barrier every 4 k steps, as rung 8's main loop does, and last tf32
// m16n8k8 with the operands in registers. What the full
// kernel loses against these numbers is lost to feeding shared memory from global memory and to
// the work around the main loop. Needs sm_80 or newer:
//
//   nvcc -O3 -arch=sm_80 -o /tmp/mma_sync_ceiling scripts/mma_sync_ceiling.cu   (Ampere, Ada)
//   nvcc -O3 -gencode=arch=compute_90a,code=sm_90a -o /tmp/mma_sync_ceiling \
//       scripts/mma_sync_ceiling.cu                                             (Hopper)
//   /tmp/mma_sync_ceiling
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

#include "../torch_mm_variants/csrc/cuda/mma.cuh"  // rung 8's own wrappers: no torch needed

namespace {

using namespace mm_variants::cuda;

constexpr int kIterations = 2000;
constexpr double kFlopsPerMma = 2.0 * 16 * 8 * 16;

// A random bf16 in [-1, 1) for index i: the tensor cores' power, and so the clock they run at,
// depends on the bits they multiply, so the operands look like those of a real product.
__device__ __forceinline__ uint16_t random_bf16(uint32_t i) {
  i = (i ^ 61u) ^ (i >> 16);
  i *= 9u;
  i ^= i >> 4;
  i *= 0x27d4eb2du;
  i ^= i >> 15;
  const float x = static_cast<float>(i & 0xffffu) / 32768.0f - 1.0f;
  return static_cast<uint16_t>(__float_as_uint(x) >> 16);
}

__device__ __forceinline__ uint32_t random_pair(uint32_t i) {
  return random_bf16(2 * i) | static_cast<uint32_t>(random_bf16(2 * i + 1)) << 16;
}

// Keeps the sums alive without storing them: the compiler cannot drop the MMAs.
template <int MT, int NT>
__device__ void keep(const float (&acc)[MT][NT][4], float* sink) {
  float sum = 0;
  for (int i = 0; i < MT; ++i)
    for (int j = 0; j < NT; ++j)
      for (int q = 0; q < 4; ++q) sum += acc[i][j][q];
  if (sum == 1.2345f) *sink = sum;
}

// One fragment register: two random bf16, or one random float for tf32 (whose low 13 bits the
// tensor core ignores).
template <bool kTf32>
__device__ __forceinline__ uint32_t random_register(uint32_t i) {
  return kTf32 ? uint32_t(random_bf16(i)) << 16 | random_bf16(i + 7919) : random_pair(i);
}

// Each warp: an (MT * 16) x (NT * 8) accumulator tile, fragments fixed in registers; bf16
// m16n8k16, or tf32 m16n8k8 (half the multiply-adds per instruction).
template <int MT, int NT, bool kTf32>
__global__ void registers_only(float* sink, int iterations) {
  uint32_t a[MT][4], b[NT][2];
  const uint32_t thread = blockIdx.x * blockDim.x + threadIdx.x;
  for (int i = 0; i < MT; ++i)
    for (int q = 0; q < 4; ++q) a[i][q] = random_register<kTf32>(thread * 64 + i * 4 + q);
  for (int i = 0; i < NT; ++i)
    for (int q = 0; q < 2; ++q) b[i][q] = random_register<kTf32>(thread * 64 + 32 + i * 2 + q);
  float acc[MT][NT][4] = {};
  for (int it = 0; it < iterations; ++it) {
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        if constexpr (kTf32) {
          mma::mma_m16n8k8_tf32(acc[i][j], a[i], b[j]);
        } else {
          mma::mma_m16n8k16_bf16(acc[i][j], a[i], b[j]);
        }
      }
  }
  keep(acc, sink);
}

// Rung 8's main loop without its copies: 8 warps as 2 x 4 over a 128 x 256 stage of 64 k (rows of
// 128 bytes, their chunks swizzled as rung 8's), fragments of the next k step loaded by ldmatrix
// while the current one multiplies, and, when `barrier` is set, one __syncthreads per stage
// before its last k step.
constexpr int kRow = 64, kStageElems = (128 + 256) * kRow;

__global__ void __launch_bounds__(256, 1) from_shared(float* sink, int iterations, bool barrier) {
  extern __shared__ uint16_t stage[];
  for (int i = threadIdx.x; i < kStageElems; i += blockDim.x) {
    stage[i] = random_bf16(blockIdx.x * kStageElems + i);
  }
  __syncthreads();
  const uint32_t base = mma::smem_addr(stage);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, j = lane / 8, r = lane % 8;
  const int warp_m = warp % 2 * 64, warp_n = warp / 2 * 64;
  // Every row a lane reads is r modulo 8, so all its loads share the swizzle mask of row r.
  using Swizzle = mma::Swizzle<true>;
  const uint32_t a_lane = base + (warp_m + j % 2 * 8 + r) * kRow * 2;
  const uint32_t b_lane = base + (128 + warp_n + j / 2 * 8 + r) * kRow * 2;
  const uint32_t a_col = (j / 2 ^ Swizzle::mask(r)) * 8, b_col = (j % 2 ^ Swizzle::mask(r)) * 8;
  float acc[4][8][4] = {};
  uint32_t a[2][4][4], b[2][8][2];
  for (int it = 0; it < iterations; ++it) {
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      if (barrier && ks == 3) __syncthreads();
      const int next = (ks + 1) % 2, kk = (ks + 1) % 4 * 16;
#pragma unroll
      for (int mi = 0; mi < 4; ++mi) {
        mma::ldmatrix_x4(a[next][mi], a_lane + (mi * 16 * kRow + (a_col ^ kk)) * 2);
      }
#pragma unroll
      for (int np = 0; np < 4; ++np) {
        uint32_t x[4];
        mma::ldmatrix_x4(x, b_lane + (np * 16 * kRow + (b_col ^ kk)) * 2);
        for (int q = 0; q < 4; ++q) b[next][2 * np + q / 2][q % 2] = x[q];
      }
#pragma unroll
      for (int mi = 0; mi < 4; ++mi)
#pragma unroll
        for (int ni = 0; ni < 8; ++ni) {
          mma::mma_m16n8k16_bf16(acc[mi][ni], a[ks % 2][mi], b[ks % 2][ni]);
        }
    }
  }
  keep(acc, sink);
}

// The best of five timed launches, in TFLOP/s.
template <typename Launch>
double best_tflops(Launch launch, double flops) {
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  launch(10);  // warm-up
  float best = 1e30f;
  for (int i = 0; i < 5; ++i) {
    cudaEventRecord(start);
    launch(kIterations);
    cudaEventRecord(stop);
    cudaEventSynchronize(stop);
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    best = ms < best ? ms : best;
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return flops / best / 1e9;
}

template <int MT, int NT, bool kTf32 = false>
void report_registers_only(float* sink, int warps, int sms) {
  const double flops =
      kFlopsPerMma / (kTf32 ? 2 : 1) * MT * NT * double(kIterations) * warps * sms;
  const double tflops = best_tflops(
      [&](int n) { registers_only<MT, NT, kTf32><<<sms, 32 * warps>>>(sink, n); }, flops);
  std::printf("| registers only%s | %d x %d | %d | %.1f |\n", kTf32 ? ", tf32 m16n8k8" : "",
              MT * 16, NT * 8, warps, tflops);
}

void report_from_shared(float* sink, bool barrier, int sms) {
  const int bytes = kStageElems * 2;
  cudaFuncSetAttribute(from_shared, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  const double flops = kFlopsPerMma * 32 * 4 * double(kIterations) * 8 * sms;
  const double tflops = best_tflops(
      [&](int n) { from_shared<<<sms, 256, bytes>>>(sink, n, barrier); }, flops);
  std::printf("| ldmatrix from shared memory%s | 64 x 64 | 8 | %.1f |\n",
              barrier ? ", a barrier per 64 k" : "", tflops);
}

}  // namespace

int main() {
  int sms = 0;
  cudaDeviceProp properties;
  if (cudaGetDeviceProperties(&properties, 0) != cudaSuccess) {
    std::fprintf(stderr, "no CUDA device\n");
    return 1;
  }
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  float* sink = nullptr;
  cudaMalloc(&sink, sizeof(float));
  std::printf("%s, one block per SM, bf16 mma.sync m16n8k16 with float accumulation\n\n",
              properties.name);
  std::printf("| fragments | warp tile | warps per block | TFLOP/s |\n");
  std::printf("| --- | --- | ---: | ---: |\n");
  report_registers_only<4, 8>(sink, 8, sms);
  report_registers_only<4, 8>(sink, 4, sms);
  report_registers_only<4, 8>(sink, 12, sms);
  report_registers_only<2, 8>(sink, 16, sms);
  report_from_shared(sink, false, sms);
  report_from_shared(sink, true, sms);
  report_registers_only<4, 8, true>(sink, 8, sms);
  const cudaError_t error = cudaDeviceSynchronize();
  if (error != cudaSuccess) {
    std::fprintf(stderr, "CUDA error: %s\n", cudaGetErrorString(error));
    return 1;
  }
  return 0;
}
