// mm_variants::matmul: the op's schema, its input validation and the CPU registration.
//
// Validation lives here, once, before any kernel runs: kernels may assume 2-D inputs of one
// dtype on one device with matching inner dimensions and M, N, K >= 1.
#include "matmul.h"

#include "auto.h"

#include "cpu/simd.h"

#include <ATen/ATen.h>
#include <torch/extension.h>
#include <torch/library.h>

#include <atomic>
#include <limits>
#include <sstream>

namespace mm_variants {
namespace {

std::string dtype_list(const Algorithm& algorithm) {
  std::ostringstream out;
  for (size_t i = 0; i < algorithm.dtypes.size(); ++i) {
    out << (i ? ", " : "") << c10::toString(algorithm.dtypes[i]);
  }
  return out.str();
}

void check_floating(const char* op, c10::ScalarType dtype) {
  TORCH_CHECK(c10::isFloatingType(dtype), op, ": unsupported dtype ", dtype,
              "; supported: Float, Half, BFloat16 (and Double on the CPU)");
}

}  // namespace

void check_strided(const char* op, const char* name, const at::Tensor& t) {
  // A strided nested tensor reports the strided layout, but has no sizes to read.
  TORCH_CHECK(!t.is_nested(), op, ": ", name, " is a nested tensor; nested tensors are not "
              "supported (multiply its unbind()'s tensors one by one)");
  TORCH_CHECK(t.layout() == at::kStrided, op, ": ", name, " must be a dense (strided) tensor, "
              "got layout ", t.layout(), "; convert it with .to_dense()");
}

namespace {

// The checks of one product's operands. `op` names the op in the messages: linear and bmm run
// them too, on the product they choose their algorithm for.
void check_inputs(const char* op, const at::Tensor& a, const at::Tensor& b) {
  check_strided(op, "a", a);
  check_strided(op, "b", b);
  TORCH_CHECK(a.dim() == 2, op, ": a must be a matrix, got a ", a.dim(), "-D tensor");
  TORCH_CHECK(b.dim() == 2, op, ": b must be a matrix, got a ", b.dim(), "-D tensor");
  TORCH_CHECK(a.size(1) == b.size(0), op, ": a and b shapes cannot be multiplied (", a.size(0),
              "x", a.size(1), " and ", b.size(0), "x", b.size(1), ")");
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), op,
              ": expected a and b to have the same dtype, but got: ", a.scalar_type(), " != ",
              b.scalar_type());
  TORCH_CHECK(a.device() == b.device(), op, ": expected a and b on the same device, but found ",
              a.device(), " and ", b.device());
  check_floating(op, a.scalar_type());
}

void check_supports(const char* op, const Algorithm& algorithm, c10::ScalarType dtype,
                    c10::Device device) {
  TORCH_CHECK(algorithm.supports(dtype), op, ": algorithm '", algorithm.name,
              "' does not support dtype ", dtype, " on ", device.type(), "; it supports: ",
              dtype_list(algorithm));
}

void check_algorithm_accepts(const char* op, const Algorithm& algorithm, const at::Tensor& a,
                             const at::Tensor& b) {
  check_supports(op, algorithm, a.scalar_type(), a.device());
  TORCH_CHECK(algorithm.accepts == nullptr || algorithm.accepts(a, b), op, ": algorithm '",
              algorithm.name, "' cannot take these inputs: ", algorithm.why_not);
}

// When set, every output is filled with NaN before its kernel runs, so that an element a kernel
// forgets to write shows up in the tests instead of reading as whatever memory held.
std::atomic<bool> poison_outputs{false};

}  // namespace

const Algorithm& resolve_algorithm(const char* op, const at::Tensor& a, const at::Tensor& b,
                                   c10::string_view algorithm) {
  check_inputs(op, a, b);
  const std::string name(algorithm);
  const Algorithm& chosen =
      name == "auto" ? choose_auto(a, b, op) : find_algorithm(a.device(), name, op);
  check_algorithm_accepts(op, chosen, a, b);
  return chosen;
}

at::Tensor new_scratch(at::IntArrayRef sizes, const at::TensorOptions& options) {
  at::Tensor out = at::empty(sizes, options);
  if (poison_outputs.load(std::memory_order_relaxed)) {
    out.fill_(std::numeric_limits<double>::quiet_NaN());
  }
  return out;
}

at::Tensor new_output(int64_t m, int64_t n, const at::TensorOptions& options) {
  return new_scratch({m, n}, options);
}

at::Tensor matmul(const at::Tensor& a, const at::Tensor& b, c10::string_view algorithm) {
  const Algorithm& chosen = resolve_algorithm(kMatmulOp, a, b, algorithm);
  const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  if (m == 0 || n == 0 || k == 0) return at::zeros({m, n}, a.options());
  at::Tensor out = new_output(m, n, a.options());
  chosen.run(a, b, out);
  return out;
}

std::vector<std::string> algorithm_names(const std::string& device) {
  std::vector<std::string> names;
  for (const Algorithm* algorithm : algorithms_for(c10::Device(device))) {
    names.push_back(algorithm->name);
  }
  return names;
}

std::vector<std::string> algorithm_dtypes(const std::string& device, const std::string& name) {
  std::vector<std::string> dtypes;
  for (c10::ScalarType dtype : find_algorithm(c10::Device(device), name).dtypes) {
    dtypes.push_back(c10::toString(dtype));
  }
  return dtypes;
}

std::tuple<bool, std::string> algorithm_accepts(const std::string& name, const at::Tensor& a,
                                                const at::Tensor& b) {
  check_inputs(kMatmulOp, a, b);
  if (name == "auto") return {true, ""};  // auto picks among the algorithms that accept
  const Algorithm& algorithm = find_algorithm(a.device(), name);
  if (!algorithm.supports(a.scalar_type())) return {false, "does not support dtype"};
  if (algorithm.accepts != nullptr && !algorithm.accepts(a, b)) return {false, algorithm.why_not};
  return {true, ""};
}

// resolve_algorithm's checks that read only the dtype, the device and the name, for the fake
// kernels (ops.py): torch.compile then refuses what eager mode refuses, with the same message.
// An algorithm's `accepts` reads sizes and settings of the run, so it is left to the run.
void check_dtype_and_algorithm(const std::string& op, c10::ScalarType dtype, c10::Device device,
                               const std::string& name) {
  check_floating(op.c_str(), dtype);
  if (device.is_meta()) return;  // no kernels to look up: the fake kernel is a meta tensor's own
  if (name == "auto") return check_auto_dtype(op.c_str(), device, dtype);
  check_supports(op.c_str(), find_algorithm(device, name, op.c_str()), dtype, device);
}

namespace {

AutoDecision explain_product(const char* op, const at::Tensor& a, const at::Tensor& b) {
  check_inputs(op, a, b);
  return decide_auto(a, b, op);
}

}  // namespace

std::tuple<std::string, std::string, std::string> explain_auto(const at::Tensor& a,
                                                               const at::Tensor& b) {
  // torch_mm_variants.matmul sends a batch a [B, M, K] to mm_variants::bmm, whose auto reads
  // the inputs of one product (the batch's rows against a shared b, or one entry's), and whose
  // name its refusals give. A batch of small entries runs in one launch of a batched kernel
  // (batch_algorithm), with reason "batched".
  AutoDecision decision;
  if (a.dim() == 3) {
    const BatchChoice choice = batch_choice_inputs(a, b);
    decision = explain_product("mm_variants::bmm", choice.a, choice.b);
    if (!choice.one_product) {
      const Algorithm& batched =
          batch_algorithm(*decision.algorithm, "auto", choice.a, choice.b, a.size(0));
      if (&batched != decision.algorithm) decision = {&batched, "batched", decision.bucket};
    }
  } else {
    decision = explain_product(kMatmulOp, a, b);
  }
  return {decision.algorithm->name, decision.reason, decision.bucket};
}

}  // namespace mm_variants

TORCH_LIBRARY(mm_variants, m) {
  m.def("matmul(Tensor a, Tensor b, str algorithm=\"auto\") -> Tensor");
}

TORCH_LIBRARY_IMPL(mm_variants, CPU, m) { m.impl("matmul", &mm_variants::matmul); }

// An operand of another layout (sparse, mkldnn) or a quantized one sends the call to its own
// dispatch key, where without a kernel the dispatcher's "Could not run ... backend" error would
// answer. matmul's checks refuse it by name there before reading anything, as bmm's and linear's
// (CompositeExplicitAutograd, which covers these keys) do. A nested tensor's keys, which
// CompositeExplicitAutograd does not cover, get all three ops (bmm.cpp, linear.cpp).
#define MM_VARIANTS_REFUSE_ON(key) \
  TORCH_LIBRARY_IMPL(mm_variants, key, m) { m.impl("matmul", &mm_variants::matmul); }
MM_VARIANTS_REFUSE_ON(SparseCPU)
MM_VARIANTS_REFUSE_ON(SparseCUDA)
MM_VARIANTS_REFUSE_ON(SparseCsrCPU)
MM_VARIANTS_REFUSE_ON(SparseCsrCUDA)
MM_VARIANTS_REFUSE_ON(MkldnnCPU)
MM_VARIANTS_REFUSE_ON(QuantizedCPU)
MM_VARIANTS_REFUSE_ON(QuantizedCUDA)
MM_VARIANTS_REFUSE_ON(NestedTensorCPU)
MM_VARIANTS_REFUSE_ON(NestedTensorCUDA)
#undef MM_VARIANTS_REFUSE_ON

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("algorithms", &mm_variants::algorithm_names,
        "Names of the algorithms that can run on a device ('cpu', 'cuda', 'cuda:1'), in ladder "
        "order");
  m.def("registered_algorithms", &mm_variants::registered_names,
        "Every registered algorithm name, for any device type, in ladder order");
  m.def("algorithm_dtypes", &mm_variants::algorithm_dtypes,
        "The dtypes (as c10 names: Float, Half, BFloat16, Double) an algorithm accepts on a device");
  m.def("algorithm_fuses_epilogue",
        [](const std::string& device, const std::string& name) {
          return mm_variants::find_algorithm(c10::Device(device), name).run_fused != nullptr;
        },
        "Whether an algorithm fuses mm_variants::linear's bias and activation into its store");
  m.def("algorithm_runs_batches",
        [](const std::string& device, const std::string& name) {
          return mm_variants::find_algorithm(c10::Device(device), name).run_batched != nullptr;
        },
        "Whether an algorithm runs a whole mm_variants::bmm batch in one launch");
  m.def("set_poison_outputs", [](bool on) { mm_variants::poison_outputs.store(on); },
        "Fill every output with NaN before its kernel runs (for tests)");
  m.def("algorithm_accepts", &mm_variants::algorithm_accepts,
        "(accepted, reason) for running an algorithm on these inputs");
  m.def("check_dtype_and_algorithm", &mm_variants::check_dtype_and_algorithm,
        "The op's checks that read only the inputs' dtype and device and the algorithm name, with "
        "its messages (for the fake kernels)");
  m.def("check_strided", &mm_variants::check_strided,
        "Refuses a nested or non-strided operand by name: (op, operand's name, tensor)");
  m.def("dtype_name", [](c10::ScalarType dtype) { return std::string(c10::toString(dtype)); },
        "A dtype's name as the op's messages write it: Float, Half, BFloat16, Double, Long, ...");
  m.def("explain_auto", &mm_variants::explain_auto,
        "(algorithm, reason, bucket) of what algorithm='auto' runs for these inputs (for a 3-D "
        "a, what mm_variants::bmm runs)");
  m.def("set_autotune", &mm_variants::set_autotune, "Switch the measured mode of 'auto' on or off");
  m.def("autotune_enabled", &mm_variants::autotune_enabled);
  m.def("set_tuning_file", &mm_variants::set_tuning_file);
  m.def("add_tuned_entries", &mm_variants::add_tuned_entries);
  m.def("tuned_entries", &mm_variants::tuned_entries);
  m.def("clear_tuned_entries", &mm_variants::clear_tuned_entries);
  m.def("cpu_isa", &mm_variants::cpu::simd::isa,
        "The instruction set of the CPU SIMD micro-kernel: avx512, avx2 or generic");
  m.def("cpu_last_micro_kernel", &mm_variants::cpu::simd::last_isa,
        "The instruction set of the CPU SIMD micro-kernel that ran last (for tests)");
  m.def("set_cpu_isa", &mm_variants::cpu::simd::set_isa,
        "Forces the CPU SIMD micro-kernel onto a supported instruction set (for tests)");
  m.def("has_cuda", []() {
#ifdef MM_VARIANTS_WITH_CUDA
    return true;
#else
    return false;
#endif
  }, "Whether this build contains the CUDA kernels");
  m.def("has_sm90a", []() {
#ifdef MM_VARIANTS_WITH_CUDA
    return mm_variants::cuda::built_with_sm90a();
#else
    return false;
#endif
  }, "Whether this build contains the sm_90a kernels (wgmma, TMA) of the Hopper rungs");
}
