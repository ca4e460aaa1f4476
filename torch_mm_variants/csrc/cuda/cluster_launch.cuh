// Host side of thread-block clusters (sm_90): a launch whose blocks are grouped into clusters that
// run at once on neighbouring SMs of one GPC, and how many such clusters fit on the GPU together.
// Rung 9 pairs blocks to share B tiles and splits K over a cluster for small outputs; rung 11
// splits K over a cluster. Both add their split partial sums through distributed shared memory.
#pragma once

#include "common.cuh"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

namespace mm_variants::cuda {

// The launch of `grid` blocks of `threads` threads with `smem_bytes` of dynamic shared memory on
// the current stream, in clusters of `cluster` blocks. With `early_start` it is a programmatic
// dependent launch: its blocks may start while the kernel before it on the stream finishes, and
// must wait for that kernel (hopper::wait_for_previous_grid) before touching global memory. It
// points at its own attributes, so it is built in place and never copied.
class ClusterLaunch {
 public:
  ClusterLaunch(dim3 grid, dim3 cluster, int threads, int smem_bytes, bool early_start = false) {
    attributes_[0].id = cudaLaunchAttributeClusterDimension;
    attributes_[0].val.clusterDim.x = cluster.x;
    attributes_[0].val.clusterDim.y = cluster.y;
    attributes_[0].val.clusterDim.z = cluster.z;
    attributes_[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attributes_[1].val.programmaticStreamSerializationAllowed = 1;
    config_.gridDim = grid;
    config_.blockDim = dim3(threads);
    config_.dynamicSmemBytes = smem_bytes;
    config_.stream = c10::cuda::getCurrentCUDAStream();
    config_.attrs = attributes_;
    config_.numAttrs = early_start ? 2 : 1;
  }
  ClusterLaunch(const ClusterLaunch&) = delete;
  ClusterLaunch& operator=(const ClusterLaunch&) = delete;

  const cudaLaunchConfig_t& config() const { return config_; }

  template <typename... Params, typename... Args>
  void run(void (*kernel)(Params...), Args&&... args) const {
    C10_CUDA_CHECK(cudaLaunchKernelEx(&config_, kernel, std::forward<Args>(args)...));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }

 private:
  cudaLaunchAttribute attributes_[2] = {};  // the cluster shape, then early start
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
    const ClusterLaunch one_cluster(cluster, cluster, threads, smem_bytes);
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
