// The CUDA tuner behind the measured mode of algorithm="auto" (auto.h): times each candidate
// kernel on the real inputs with CUDA events on the inputs' device's current stream.
#include "../auto.h"
#include "common.cuh"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>

#include <string>

namespace mm_variants::cuda {
namespace {

constexpr int kTimedRuns = 5;

struct EventPair {
  cudaEvent_t start = nullptr, stop = nullptr;
  EventPair() {
    C10_CUDA_CHECK(cudaEventCreate(&start));
    C10_CUDA_CHECK(cudaEventCreate(&stop));
  }
  ~EventPair() {
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
  }
};

std::vector<double> time_on_gpu(const std::vector<const Algorithm*>& candidates,
                                const at::Tensor& a, const at::Tensor& b) {
  // Callers reach here from explain_auto too, outside the op's own guard: the kernels launch on,
  // the events time and the capture check asks about the current stream of the current device,
  // which must be the inputs'.
  const c10::cuda::CUDAGuard guard(a.device());
  // Timing synchronizes, which graph capture forbids: report "not now" instead. CUDA tells
  // whether a stream is capturing, not whether any is, so a call on a stream outside a capture
  // still measures, as cudnn.benchmark does (the README says so).
  if (c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None) {
    return {};
  }
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(a.device().index());
  at::Tensor out = at::empty({a.size(0), b.size(1)}, a.options());
  EventPair events;
  std::vector<double> ms;
  for (const Algorithm* algorithm : candidates) {
    algorithm->run(a, b, out);  // warm-up: module load, shared-memory opt-in
    C10_CUDA_CHECK(cudaEventRecord(events.start, stream));
    for (int i = 0; i < kTimedRuns; ++i) algorithm->run(a, b, out);
    C10_CUDA_CHECK(cudaEventRecord(events.stop, stream));
    C10_CUDA_CHECK(cudaEventSynchronize(events.stop));
    float elapsed = 0;
    C10_CUDA_CHECK(cudaEventElapsedTime(&elapsed, events.start, events.stop));
    ms.push_back(elapsed / kTimedRuns);
  }
  return ms;
}

std::string gpu_name(c10::Device device) { return device_properties(device.index()).name; }

const bool registered = (register_device_tuner(c10::kCUDA, {&time_on_gpu, &gpu_name}), true);

}  // namespace
}  // namespace mm_variants::cuda
