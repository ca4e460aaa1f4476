// The epilogue's host side: parsing an activation name, and applying an epilogue with ATen ops
// for the kernels that do not fuse it (epilogue.h).
#include "epilogue.h"
#include "registry.h"

#include <ATen/ATen.h>

namespace mm_variants {

void apply_epilogue(const Epilogue& epilogue, at::Tensor& out) {
  if (epilogue.bias.defined()) out.add_(epilogue.bias);
  switch (epilogue.activation) {
    case Activation::kRelu: out.relu_(); break;
    case Activation::kGelu: at::gelu_(out, "none"); break;
    case Activation::kGeluTanh: at::gelu_(out, "tanh"); break;
    case Activation::kSilu: at::silu_(out); break;
    default: break;
  }
}

Activation parse_activation(c10::string_view name) {
  if (name == "none") return Activation::kNone;
  if (name == "relu") return Activation::kRelu;
  if (name == "gelu") return Activation::kGelu;
  if (name == "gelu_tanh") return Activation::kGeluTanh;
  if (name == "silu") return Activation::kSilu;
  TORCH_CHECK(false, "mm_variants::linear: unknown activation '", printable_name(name),
              "'; valid: none, relu, gelu, gelu_tanh, silu");
}

}  // namespace mm_variants
