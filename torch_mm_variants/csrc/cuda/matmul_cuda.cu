// The CUDA registration of mm_variants::matmul. It lives in a .cu file so that a CPU-only build
// drops it with the rest of the CUDA sources.
//
// The op body (validation, algorithm choice, allocation) is shared with the CPU; here it runs
// under a guard for the inputs' device, so kernels launch on that device's current stream even
// when another device is current.
#include "../matmul.h"

#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

namespace mm_variants::cuda {
namespace {

at::Tensor matmul_cuda(const at::Tensor& a, const at::Tensor& b, c10::string_view algorithm) {
  const c10::cuda::OptionalCUDAGuard guard(a.is_cuda() ? a.device() : b.device());
  return mm_variants::matmul(a, b, algorithm);
}

}  // namespace

bool built_with_sm90a() {
#if defined(MM_VARIANTS_WITH_SM90A)
  return true;
#else
  return false;
#endif
}

}  // namespace mm_variants::cuda

TORCH_LIBRARY_IMPL(mm_variants, CUDA, m) { m.impl("matmul", &mm_variants::cuda::matmul_cuda); }
