// The second pass of a K split on the CUDA cores (rungs 8 and 10): each split leaves its float32
// sums in its own slice of a buffer (M x N, row-major, slices `slice` elements apart), and this
// pass adds them in split order into the output, through the epilogue where it has one. No
// atomics, so the result is the same bits on every run.
#pragma once

#include "common.cuh"
#include "epilogue.cuh"

#include <algorithm>
#include <cstdint>

namespace mm_variants::cuda {

// out[m][n] (rows ldc apart) = epi(slice 0's [m][n] + ... + slice (splits - 1)'s, n), in T.
template <typename T, class Epi>
__global__ void sum_splits_kernel(const float* partial, int64_t slice, int splits, T* out,
                                  int64_t M, int64_t N, int64_t ldc, Epi epi) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < M * N;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float sum = 0.0f;
    for (int s = 0; s < splits; ++s) sum += partial[s * slice + i];
    const int64_t m = i / N, n = i - m * N;
    out[m * ldc + n] = static_cast<T>(epi(sum, static_cast<int>(n)));
  }
}

// Launches sum_splits_kernel on the current stream.
template <typename T, class Epi = NoEpilogue>
void sum_splits(const float* partial, int64_t slice, int splits, T* out, int64_t M, int64_t N,
                int64_t ldc, const Epi& epi = {}) {
  const int grid = static_cast<int>(std::min<int64_t>((M * N + 255) / 256, 4 * 1024));
  sum_splits_kernel<T, Epi><<<grid, 256, 0, c10::cuda::getCurrentCUDAStream()>>>(
      partial, slice, splits, out, M, N, ldc, epi);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace mm_variants::cuda
