// The second pass of a K split on the CUDA cores (rungs 8, 10, 12): each split leaves its float32
// sums in its own slice of a buffer (M x N, row-major, slices `slice` elements apart), and this
// pass adds them in split order into the output, through the epilogue where it has one. No
// atomics, so the result is the same bits on every run.
#pragma once

#include "common.cuh"
#include "epilogue.cuh"
#include "hopper.cuh"
#include "launch.cuh"

#include <algorithm>
#include <cstdint>

namespace mm_variants::cuda {

// How the blocks of a memory-bound decode product (rungs 10 and 12) split K: `blocks` blocks
// along N; a split is whole steps of `step` k and at least `min_k` (each warp of a block a step).
struct KSplit {
  int splits;
  int64_t k_per_block;
};

// Up to two blocks per SM where N alone gives fewer blocks than SMs, while every split keeps
// min_k. Rounded down: a third block on some SMs would run as a second wave, and those SMs would
// stream more of the weight than with fewer, longer splits (float32 at one token on rung 10,
// whose blocks fit two per SM, on 1024 x 4096: 5 splits put 3 blocks of 832 k on some SMs, 4
// splits at most 2 of 1024).
inline KSplit split_k(int64_t blocks, int64_t K, int step, int64_t min_k, int max_splits) {
  const int sms = device_properties(c10::cuda::current_device()).multiProcessorCount;
  int64_t splits = 1;
  if (blocks < sms) splits = std::max<int64_t>(std::min({2 * sms / blocks, K / min_k,
                                                         static_cast<int64_t>(max_splits)}), 1);
  const int64_t k_per_block = static_cast<int64_t>(ceil_div(ceil_div(K, splits), step)) * step;
  return {static_cast<int>(ceil_div(K, k_per_block)), k_per_block};
}

// out[m][n] (rows ldc apart) = epi(slice 0's [m][n] + ... + slice (splits - 1)'s, n), in T.
template <typename T, class Epi>
__global__ void sum_splits_kernel(const float* partial, int64_t slice, int splits, T* out,
                                  int64_t M, int64_t N, int64_t ldc, Epi epi) {
  // Launched early (see sum_splits), the block waits here for the splits to be written.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  hopper::wait_for_previous_grid();
  hopper::allow_next_grid();
#endif
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < M * N;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float sum = 0.0f;
    for (int s = 0; s < splits; ++s) sum += partial[s * slice + i];
    const int64_t m = i / N, n = i - m * N;
    out[m * ldc + n] = static_cast<T>(epi(sum, static_cast<int>(n)));
  }
}

// Launches sum_splits_kernel on the current stream. On sm_90a it starts early (a programmatic
// dependent launch): its blocks are set up while the splits are still computed, and the launch's
// gap after them, which is as long as adding the sums of a small product, is hidden.
template <typename T, class Epi = NoEpilogue>
void sum_splits(const float* partial, int64_t slice, int splits, T* out, int64_t M, int64_t N,
                int64_t ldc, const Epi& epi = {}) {
  const int grid = static_cast<int>(std::min<int64_t>((M * N + 255) / 256, 4 * 1024));
  KernelLaunch launch(dim3(grid), 256, 0);
  launch.starting_early(sm90a(c10::Device(c10::kCUDA, c10::cuda::current_device())));
  launch.run(sum_splits_kernel<T, Epi>, partial, slice, splits, out, M, N, ldc, epi);
}

}  // namespace mm_variants::cuda
