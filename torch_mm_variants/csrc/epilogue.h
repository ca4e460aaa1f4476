// What mm_variants::linear applies to a @ b before the result is stored: an optional bias per
// output column, then an activation. Kernels that fuse it do so while the sums are still in
// float32 (one rounding, no second pass over the output); the others get it applied by ATen.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/string_view.h>

#include <cmath>
#include <string>

namespace mm_variants {

enum class Activation { kNone, kRelu, kGelu, kGeluTanh, kSilu };

// "none", "relu", "gelu" (erf), "gelu_tanh" or "silu"; anything else is refused by name.
Activation parse_activation(c10::string_view name);

struct Epilogue {
  at::Tensor bias;  // undefined, or a contiguous [N] tensor of the output dtype
  Activation activation = Activation::kNone;
};

// Applies the epilogue in place with ATen ops, on an output already rounded to its dtype: for
// kernels that do not fuse it, and for inputs a fused kernel leaves to the unfused path.
void apply_epilogue(const Epilogue& epilogue, at::Tensor& out);

template <typename A>
inline A activate(A x, Activation activation) {
  switch (activation) {
    case Activation::kRelu:
      return x < A(0) ? A(0) : x;  // NaN stays NaN, as in torch.relu
    case Activation::kGelu:
      return A(0.5) * x * (A(1) + std::erf(x * A(0.70710678118654752440)));
    case Activation::kGeluTanh:
      return A(0.5) * x *
             (A(1) + std::tanh(A(0.79788456080286535588) * (x + A(0.044715) * x * x * x)));
    case Activation::kSilu:
      return x / (A(1) + std::exp(-x));
    default:
      return x;
  }
}

}  // namespace mm_variants
