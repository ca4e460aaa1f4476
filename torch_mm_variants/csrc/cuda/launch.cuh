// Host side of launches with attributes (cudaLaunchKernelEx): thread-block clusters (sm_90),
// whose blocks run at once on neighbouring SMs of one GPC, how many such clusters fit on the GPU
// together, and programmatic dependent launches. Rung 9 pairs blocks to share B tiles and splits
// K over a cluster for small outputs; rung 11 splits K over a cluster. Both add their split
// partial sums through distributed shared memory. Rung 9 starts every launch early, rungs 10 and
// 11 some of theirs.
#pragma once

#include "common.cuh"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

namespace mm_variants::cuda {

// The launch of `grid` blocks of `threads` threads with `smem_bytes` of dynamic shared memory on
// the current stream, with the attributes its setters add. It points at its own attributes, so it
// is built in place and never copied.
class KernelLaunch {
 public:
  KernelLaunch(dim3 grid, int threads, int smem_bytes) {
    config_.gridDim = grid;
    config_.blockDim = dim3(threads);
    config_.dynamicSmemBytes = smem_bytes;
    config_.stream = c10::cuda::getCurrentCUDAStream();
    config_.attrs = attributes_;
  }
  KernelLaunch(const KernelLaunch&) = delete;
  KernelLaunch& operator=(const KernelLaunch&) = delete;

  // Groups the blocks into clusters of `shape` (sm_90).
  KernelLaunch& in_clusters(dim3 shape) {
    cudaLaunchAttribute& cluster = next_attribute();
    cluster.id = cudaLaunchAttributeClusterDimension;
    cluster.val.clusterDim.x = shape.x;
    cluster.val.clusterDim.y = shape.y;
    cluster.val.clusterDim.z = shape.z;
    return *this;
  }

  // When `early`, a programmatic dependent launch: the blocks may start while the kernel before
  // them on the stream finishes, and must wait for that kernel (hopper::wait_for_previous_grid)
  // before touching global memory.
  KernelLaunch& starting_early(bool early) {
    if (early) {
      cudaLaunchAttribute& start = next_attribute();
      start.id = cudaLaunchAttributeProgrammaticStreamSerialization;
      start.val.programmaticStreamSerializationAllowed = 1;
    }
    return *this;
  }

  const cudaLaunchConfig_t& config() const { return config_; }

  template <typename... Params, typename... Args>
  void run(void (*kernel)(Params...), Args&&... args) const {
    C10_CUDA_CHECK(cudaLaunchKernelEx(&config_, kernel, std::forward<Args>(args)...));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }

 private:
  static constexpr unsigned kMaxAttributes = 2;  // a cluster shape, an early start

  cudaLaunchAttribute& next_attribute() {
    TORCH_INTERNAL_ASSERT(config_.numAttrs < kMaxAttributes, "too many launch attributes");
    return attributes_[config_.numAttrs++];
  }

  cudaLaunchAttribute attributes_[kMaxAttributes] = {};
  cudaLaunchConfig_t config_ = {};
};

// Clusters of `cluster`'s shape that fit on the GPU at once (0 when none does, or when the GPU
// takes no cluster that large), asked once per kernel, cluster shape and device. A cluster stays
// inside one GPC (about 16 SMs), so this can be fewer than the resident blocks divided by the
// cluster's size.
template <typename... Params>
int resident_clusters(void (*kernel)(Params...), dim3 cluster, int threads, int smem_bytes) {
  allow_dynamic_smem(kernel, smem_bytes);  // the query counts on the launch's shared memory
  const auto query = [&] {
    KernelLaunch one_cluster(cluster, threads, smem_bytes);
    one_cluster.in_clusters(cluster);
    int clusters = 0;
    if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &one_cluster.config()) != cudaSuccess) {
      (void)cudaGetLastError();  // a cluster shape this GPU cannot run: none fits
      return 0;
    }
    return clusters;
  };
  const int shape = static_cast<int>(cluster.x | cluster.y << 10 | cluster.z << 20);
  return once_per_kernel_and_device(reinterpret_cast<const void*>(kernel), query, shape);
}

// Blocks of `kernel` that one SM holds at once with `threads` threads and `smem_bytes` of dynamic
// shared memory, asked once per kernel, device and thread count (a caller passes one
// shared-memory size per kernel).
template <typename... Params>
int resident_blocks_per_sm(void (*kernel)(Params...), int threads, int smem_bytes) {
  allow_dynamic_smem(kernel, smem_bytes);  // the query counts on the launch's shared memory
  const auto query = [&] {
    int blocks = 0;
    C10_CUDA_CHECK(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, smem_bytes));
    return blocks;
  };
  // -threads: a variant no cluster shape of resident_clusters takes.
  return once_per_kernel_and_device(reinterpret_cast<const void*>(kernel), query, -threads);
}

// A K split over clusters of group x splits blocks, one cluster per `group` columns of the grid:
// the most splits (at most max_splits, each at least min_steps of the k_steps K steps) for which
// all `clusters` fit on the GPU at once, since a second wave would take as long as the first.
// Returns the steps per split; ceil_div(k_steps, that) splits are then all non-empty.
template <typename... Params>
int steps_per_split(void (*kernel)(Params...), int threads, int smem_bytes, unsigned group,
                    int64_t clusters, int64_t k_steps, int max_splits, int min_steps) {
  int splits = static_cast<int>(std::min<int64_t>(max_splits, k_steps / min_steps));
  while (splits > 1 &&
         resident_clusters(kernel, dim3(group, splits), threads, smem_bytes) < clusters) {
    --splits;
  }
  return static_cast<int>(ceil_div(k_steps, std::max(splits, 1)));
}

}  // namespace mm_variants::cuda
