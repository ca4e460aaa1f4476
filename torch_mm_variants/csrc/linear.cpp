// mm_variants::linear: y = activation(x @ weight^T + bias), for x with any leading batch dims and
// an nn.Linear weight [N, K].
//
// One kernel serves every device (CompositeExplicitAutograd): it validates, then runs the chosen
// matmul algorithm. Algorithms with a fused kernel (run_fused) add the bias and apply the
// activation while storing their float32 sums; for the others the bias and activation are
// applied in place by ATen on the fresh output.
#include "epilogue.h"
#include "matmul.h"

#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/accumulate.h>
#include <torch/library.h>

namespace mm_variants {
namespace {

void check_linear_inputs(const at::Tensor& x, const at::Tensor& weight,
                         const c10::optional<at::Tensor>& bias) {
  check_strided("mm_variants::linear", "x", x);
  check_strided("mm_variants::linear", "weight", weight);
  if (bias.has_value()) check_strided("mm_variants::linear", "bias", *bias);
  TORCH_CHECK(weight.dim() == 2, "mm_variants::linear: weight must be a matrix [N, K], got a ",
              weight.dim(), "-D tensor");
  TORCH_CHECK(x.dim() >= 1, "mm_variants::linear: x must have at least one dimension");
  TORCH_CHECK(x.scalar_type() == weight.scalar_type(),
              "mm_variants::linear: expected x and weight to have the same dtype, but got: ",
              x.scalar_type(), " != ", weight.scalar_type());
  TORCH_CHECK(x.device() == weight.device(),
              "mm_variants::linear: expected x and weight on the same device, but found ",
              x.device(), " and ", weight.device());
  TORCH_CHECK(x.size(-1) == weight.size(1), "mm_variants::linear: x and weight shapes cannot be "
              "multiplied (", x.sizes(), " and ", weight.sizes(), "^T)");
  if (!bias.has_value()) return;
  TORCH_CHECK(bias->dim() == 1 && bias->size(0) == weight.size(0),
              "mm_variants::linear: bias must have shape [", weight.size(0), "], got ",
              bias->sizes());
  TORCH_CHECK(bias->scalar_type() == weight.scalar_type(),
              "mm_variants::linear: expected bias to have the dtype of weight, but got: ",
              bias->scalar_type(), " != ", weight.scalar_type());
  TORCH_CHECK(bias->device() == weight.device(),
              "mm_variants::linear: expected bias on the device of weight, but found ",
              bias->device(), " and ", weight.device());
}

at::Tensor linear(const at::Tensor& x, const at::Tensor& weight,
                  const c10::optional<at::Tensor>& bias, c10::string_view activation,
                  c10::string_view algorithm) {
  check_linear_inputs(x, weight, bias);
  const Epilogue epilogue{bias.has_value() ? bias->contiguous() : at::Tensor(),
                          parse_activation(activation)};
  const c10::OptionalDeviceGuard guard(x.device());
  const int64_t batch = c10::multiply_integers(x.sizes().begin(), x.sizes().end() - 1);
  const at::Tensor rows = x.reshape({batch, x.size(-1)});
  const at::Tensor weight_t = weight.t();
  const Algorithm& chosen = resolve_algorithm("mm_variants::linear", rows, weight_t, algorithm);

  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = weight.size(0);
  const int64_t m = rows.size(0), n = weight.size(0);
  if (m == 0 || n == 0 || rows.size(1) == 0) {  // x @ weight^T is all zeros (or empty)
    at::Tensor out = at::zeros({m, n}, x.options());
    apply_epilogue(epilogue, out);
    return out.view(shape);
  }
  at::Tensor out = new_output(m, n, x.options());
  if (chosen.run_fused != nullptr) {
    chosen.run_fused(rows, weight_t, epilogue, out);
  } else {
    chosen.run(rows, weight_t, out);
    apply_epilogue(epilogue, out);
  }
  return out.view(shape);
}

}  // namespace

}  // namespace mm_variants

TORCH_LIBRARY_FRAGMENT(mm_variants, m) {
  m.def("linear(Tensor x, Tensor weight, Tensor? bias=None, str activation=\"none\", "
        "str algorithm=\"auto\") -> Tensor");
}

TORCH_LIBRARY_IMPL(mm_variants, CompositeExplicitAutograd, m) {
  m.impl("linear", &mm_variants::linear);
}

// A nested operand's keys are not CompositeExplicitAutograd's: there the same kernel's input
// checks refuse it by name (check_strided) instead of the dispatcher's "Could not run".
TORCH_LIBRARY_IMPL(mm_variants, NestedTensorCPU, m) { m.impl("linear", &mm_variants::linear); }
TORCH_LIBRARY_IMPL(mm_variants, NestedTensorCUDA, m) { m.impl("linear", &mm_variants::linear); }
