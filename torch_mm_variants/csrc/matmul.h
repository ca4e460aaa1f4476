// The device-independent body of mm_variants::matmul, shared by the CPU registration
// (matmul.cpp) and the CUDA registration (cuda/matmul_cuda.cu).
#pragma once

#include "registry.h"

#include <c10/util/string_view.h>

#include <string>
#include <tuple>
#include <utility>

namespace mm_variants {

// Validates the inputs (with torch.mm-style messages), resolves `algorithm` (including "auto")
// through the registry, allocates the result and runs the kernel.
at::Tensor matmul(const at::Tensor& a, const at::Tensor& b, c10::string_view algorithm);

// The validation and algorithm choice of matmul, for ops built on it (linear.cpp, bmm.cpp),
// whose name `op` ("mm_variants::linear") its messages give.
const Algorithm& resolve_algorithm(const char* op, const at::Tensor& a, const at::Tensor& b,
                                   c10::string_view algorithm);

// The one product whose inputs mm_variants::bmm chooses its algorithm on, for the whole batch
// (a [B, M, K], b [B, K, N] or a shared [K, N]): against a shared b, where a's entries fold into
// one [B * M, K] matrix that `algorithm` takes, that whole product, which bmm then runs
// (one_product); else the first entry's, or an empty [0, K] x [K, 0] of the batch's dtype and
// device for an empty batch. Validates the batch's shapes as bmm does.
struct BatchChoice {
  at::Tensor a, b;
  bool one_product;
};
BatchChoice batch_choice_inputs(const at::Tensor& a, const at::Tensor& b,
                                c10::string_view algorithm = "auto");

// The algorithm that runs a batch of `batch` products: `chosen`, resolved for its first entry
// (a_entry, b_entry), or for auto over entries too small to fill the GPU, or of a few rows (decode
// products), the highest rung with a batched kernel, where `chosen` has none.
const Algorithm& batch_algorithm(const Algorithm& chosen, c10::string_view requested,
                                 const at::Tensor& a_entry, const at::Tensor& b_entry,
                                 int64_t batch);

// Refuses a sparse, mkldnn or other non-strided tensor by name: the kernels read strided memory.
// `op` and `name` say where it was passed, e.g. ("mm_variants::linear", "weight").
void check_strided(const char* op, const char* name, const at::Tensor& t);

// Whether algorithm `name` takes these valid inputs, and if not, the reason it gives.
std::tuple<bool, std::string> algorithm_accepts(const std::string& name, const at::Tensor& a,
                                                const at::Tensor& b);

// A fresh [m, n] output (NaN-filled when output poisoning is on, for the tests).
at::Tensor new_output(int64_t m, int64_t n, const at::TensorOptions& options);

// Scratch that kernels write before they read it (the partial sums of K splits): NaN-filled too
// when output poisoning is on, so that a part a kernel does not write shows in the result.
at::Tensor new_scratch(at::IntArrayRef sizes, const at::TensorOptions& options);

#ifdef MM_VARIANTS_WITH_CUDA
namespace cuda {
// Whether this build compiled the sm_90a kernels (wgmma, TMA); defined in cuda/matmul_cuda.cu,
// since the flag that says so reaches only nvcc.
bool built_with_sm90a();
}  // namespace cuda
#endif

}  // namespace mm_variants
