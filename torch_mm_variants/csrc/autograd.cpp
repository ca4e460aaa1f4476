// Gradients of mm_variants::matmul, linear and bmm, registered for the Autograd key in C++.
//
// Every call of an op passes its Autograd kernel first, gradients wanted or not. Formulas
// registered from Python (torch.library.register_autograd) make that kernel a call into the
// interpreter: about 3 us per call on a CPU, more than a small GPU matmul takes. Here a call whose
// inputs need no gradient goes straight on to the device kernel; one that does records a
// torch::autograd::Function node. The backward formulas call the ops themselves, so they run on
// the same algorithm, read transposed views in place, and are differentiable again (double
// backward). torch.compile traces them like any other op's; the fake kernels stay in ops.py.
//
// Forward-mode AD (torch.func.jvp, jacfwd, torch.autograd.forward_ad) is handled here too: a
// custom Function node carries no tangent, so when an input has one, the kernel computes the
// output's tangent with the same ops (the product rule) and attaches it, as PyTorch's own
// kernels do for their forward-mode formulas. The node saves the dual inputs, so its backward's
// products get tangents too (forward over reverse).
#include "epilogue.h"
#include "matmul.h"
#include "op_calls.h"

#include <ATen/ATen.h>
#include <ATen/OpMathType.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <string>
#include <vector>

namespace mm_variants {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Whether a call must record its gradient: grad mode is on and some input requires one.
bool records_gradient(std::initializer_list<at::Tensor> inputs) {
  if (!at::GradMode::is_enabled()) return false;
  for (const at::Tensor& t : inputs) {
    if (t.defined() && t.requires_grad()) return true;
  }
  return false;
}

// Forward-mode AD works on level 0 (functorch's transforms map their levels onto it), as in
// PyTorch's generated kernels.
constexpr uint64_t kForwardLevel = 0;

// t's tangent, undefined when it has none.
at::Tensor tangent_of(const at::Tensor& t) {
  return t.defined() ? t._fw_grad(kForwardLevel) : at::Tensor();
}

bool has_tangent(std::initializer_list<at::Tensor> inputs) {
  for (const at::Tensor& t : inputs) {
    if (tangent_of(t).defined()) return true;
  }
  return false;
}

// t without its tangent, for computing tangents from primal values only.
at::Tensor primal_of(const at::Tensor& t) {
  return t.defined() ? t._fw_primal(kForwardLevel) : at::Tensor();
}

// The sum of the defined terms, undefined if none is.
at::Tensor sum_defined(std::initializer_list<at::Tensor> terms) {
  at::Tensor sum;
  for (const at::Tensor& t : terms) {
    if (t.defined()) sum = sum.defined() ? sum + t : t;
  }
  return sum;
}

// Attaches `tangent` to `out` (a fresh output of the op).
at::Tensor with_tangent(at::Tensor out, const at::Tensor& tangent) {
  if (tangent.defined()) out._set_fw_grad(tangent, kForwardLevel, /*is_inplace_op=*/false);
  return out;
}

// [..., C] -> [rows, C]. The row count is multiplied out because reshape(-1, C) cannot infer it
// when C is 0, and flatten has no batching rule (vmapped gradients: is_grads_batched,
// jacobian(vectorize=True)).
at::Tensor as_rows(const at::Tensor& t) {
  if (t.dim() < 2) return t.unsqueeze(0);
  const c10::SymIntArrayRef sizes = t.sym_sizes();
  c10::SymInt rows = 1;
  for (size_t d = 0; d + 1 < sizes.size(); ++d) rows *= sizes[d];
  return t.reshape_symint({rows, sizes.back()});
}

// grad * activation'(pre), computed in float32 for 16-bit tensors as PyTorch's own activation
// gradients are (a float16 chain of ops for gelu_tanh overflowed to NaN from |pre| of about 700,
// and each step rounded to 16 bits), in differentiable ops (double backward works). ATen's gelu
// backward is that; its silu backward has no derivative, so silu's is written out.
at::Tensor activation_grad(const at::Tensor& grad, const at::Tensor& pre, Activation activation) {
  switch (activation) {
    case Activation::kRelu:
      return at::threshold_backward(grad, pre, 0);  // selects: inf * 0 would be NaN
    case Activation::kSilu: {
      const at::ScalarType wide = at::toOpMathType(grad.scalar_type());
      const at::Tensor p = pre.to(wide), s = at::sigmoid(p);
      return (grad.to(wide) * s * (1 + p * (1 - s))).to(grad.scalar_type());
    }
    case Activation::kGelu:
      return at::gelu_backward(grad, pre, "none");
    case Activation::kGeluTanh:
      return at::gelu_backward(grad, pre, "tanh");
    default:
      return grad;
  }
}

// The algorithm for a gradient's product lhs @ rhs (2-D, or batches of them): the forward's,
// unless it refuses these operands, then auto. A named algorithm's gradients have other shapes
// than its forward (skinny takes at most 64 rows; the weight gradient of a Linear it runs has
// out_features rows).
// Traced with symbolic sizes (torch.compile's dynamic shapes), the graph serves sizes that are
// not known yet, so no sizes are read: the forward's algorithm where it takes any operands of
// its dtypes, otherwise auto.
std::string gradient_algorithm(const std::string& algorithm, const at::Tensor& lhs,
                               const at::Tensor& rhs) {
  if (algorithm == "auto") return algorithm;
  if (lhs.unsafeGetTensorImpl()->has_symbolic_sizes_strides() ||
      rhs.unsafeGetTensorImpl()->has_symbolic_sizes_strides()) {
    return find_algorithm(lhs.device(), algorithm).accepts == nullptr ? algorithm : "auto";
  }
  if (lhs.numel() == 0 || rhs.numel() == 0) return algorithm;
  const at::Tensor l = lhs.dim() == 3 ? lhs[0] : lhs, r = rhs.dim() == 3 ? rhs[0] : rhs;
  return std::get<0>(algorithm_accepts(algorithm, l, r)) ? algorithm : "auto";
}

// The tensors a node saves for its backward: the op's inputs as they came, with their tangents.
// A C++ Function takes no dual inputs (it has no jvp), so its inputs are the primals, and these
// travel beside them (an argument of this type is no input of the node). Saved, they keep their
// tangents, so the backward's products carry tangents too: forward-over-reverse (a
// Hessian-vector product, gradgradcheck's check_fwd_over_rev) works as through torch.mm.
struct ToSave {
  variable_list tensors;
};

// The two products, matmul and bmm: (a, b, algorithm) -> a @ b.
using Product = at::Tensor (*)(const at::Tensor&, const at::Tensor&, c10::string_view);

// A product's forward: the product below autograd, with each operand (of `to_save`: a and b as
// the op got them) saved only where the other one's gradient needs it.
at::Tensor product_forward(AutogradContext* ctx, Product product, const at::Tensor& a,
                           const at::Tensor& b, const std::string& algorithm,
                           const ToSave& to_save) {
  ctx->saved_data["algorithm"] = algorithm;
  ctx->save_for_backward({b.requires_grad() ? to_save.tensors[0] : at::Tensor(),
                          a.requires_grad() ? to_save.tensors[1] : at::Tensor()});
  const at::AutoDispatchBelowADInplaceOrView below_autograd;
  return product(a, b, algorithm);
}

// lhs @ rhs through `product`, on the forward's algorithm where it takes them.
at::Tensor gradient_product(Product product, const at::Tensor& lhs, const at::Tensor& rhs,
                            const std::string& algorithm) {
  return product(lhs, rhs, gradient_algorithm(algorithm, lhs, rhs));
}

// What a product's node saved.
struct SavedProduct {
  at::Tensor a, b;
  std::string algorithm;
};

SavedProduct saved_product(AutogradContext* ctx) {
  const variable_list saved = ctx->get_saved_variables();
  return {saved[0], saved[1], ctx->saved_data["algorithm"].toStringRef()};
}

// d(a @ b)/da = grad @ b^T and d/db = a^T @ grad, through the same op and algorithm.
struct MatmulFunction : torch::autograd::Function<MatmulFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& a, const at::Tensor& b,
                            const std::string& algorithm, const ToSave& to_save) {
    return product_forward(ctx, matmul_op, a, b, algorithm, to_save);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto [a, b, algorithm] = saved_product(ctx);
    at::Tensor grad_a, grad_b;
    if (ctx->needs_input_grad(0)) grad_a = gradient_product(matmul_op, grads[0], b.t(), algorithm);
    if (ctx->needs_input_grad(1)) grad_b = gradient_product(matmul_op, a.t(), grads[0], algorithm);
    return {grad_a, grad_b, at::Tensor(), at::Tensor()};
  }
};

// With an activation, the pre-activation output is recomputed (one extra matmul) rather than kept
// alive from the forward pass.
struct LinearFunction : torch::autograd::Function<LinearFunction> {
  // An absent bias is no input of the node (an optional, not an undefined tensor).
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const c10::optional<at::Tensor>& bias, const std::string& activation,
                            const std::string& algorithm, const ToSave& to_save) {
    ctx->saved_data["activation"] = activation;
    ctx->saved_data["algorithm"] = algorithm;
    ctx->save_for_backward(to_save.tensors);  // x, weight, bias (undefined where absent)
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    return linear_op(x, weight, bias, activation, algorithm);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &weight = saved[1], &bias = saved[2];
    const Activation activation = parse_activation(ctx->saved_data["activation"].toStringRef());
    const std::string algorithm = ctx->saved_data["algorithm"].toStringRef();
    const at::Tensor rows = as_rows(x);
    at::Tensor grad_rows = as_rows(grads[0]);
    if (activation != Activation::kNone) {
      // Recomputed as the forward's product, by the algorithm that gradient_algorithm picks
      // for it, as for the gradients' products below.
      const at::Tensor pre = linear_op(
          x, weight, bias.defined() ? c10::optional<at::Tensor>(bias) : c10::nullopt, "none",
          gradient_algorithm(algorithm, rows, weight.t()));
      grad_rows = activation_grad(grad_rows, as_rows(pre), activation);
    }
    at::Tensor grad_x, grad_weight, grad_bias;
    if (ctx->needs_input_grad(0)) {
      grad_x = gradient_product(matmul_op, grad_rows, weight, algorithm)
                   .reshape_symint(x.sym_sizes());  // no guard on x's sizes under compile
    }
    if (ctx->needs_input_grad(1)) {
      grad_weight = gradient_product(matmul_op, grad_rows.t(), rows, algorithm);
    }
    if (bias.defined() && ctx->needs_input_grad(2)) grad_bias = grad_rows.sum(0);
    return {grad_x, grad_weight, grad_bias, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

struct BmmFunction : torch::autograd::Function<BmmFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& a, const at::Tensor& b,
                            const std::string& algorithm, const ToSave& to_save) {
    // Recorded here: b itself is saved only where a's gradient needs it.
    ctx->saved_data["b_batched"] = b.dim() == 3;
    return product_forward(ctx, bmm_op, a, b, algorithm, to_save);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto [a, b, algorithm] = saved_product(ctx);
    const bool b_batched = ctx->saved_data["b_batched"].toBool();
    const at::Tensor& grad = grads[0];
    at::Tensor grad_a, grad_b;
    if (ctx->needs_input_grad(0)) {  // grad @ b^T, per entry (b^T shared when b is)
      grad_a = gradient_product(bmm_op, grad, b.transpose(-1, -2), algorithm);
    }
    if (ctx->needs_input_grad(1)) {
      // a^T @ grad per entry; a shared b gathers the gradient of every entry: one product over
      // all rows.
      grad_b = b_batched ? gradient_product(bmm_op, a.transpose(1, 2), grad, algorithm)
                         : gradient_product(matmul_op, as_rows(a).t(), as_rows(grad), algorithm);
    }
    return {grad_a, grad_b, at::Tensor(), at::Tensor()};
  }
};

// A product's Autograd kernel: a node of Function when a gradient is to be recorded, else the
// product below autograd; with tangents, d(a @ b) = da @ b + a @ db attached.
template <class Function>
at::Tensor product_autograd(Product product, const at::Tensor& a, const at::Tensor& b,
                            c10::string_view algorithm) {
  const bool dual = has_tangent({a, b});
  at::Tensor out;
  if (records_gradient({a, b})) {
    // A C++ Function takes no dual inputs (it has no jvp): it gets the primals, and the tangent is
    // attached below. It saves the duals (see ToSave).
    out = Function::apply(dual ? primal_of(a) : a, dual ? primal_of(b) : b, std::string(algorithm),
                          ToSave{{a, b}});
  } else {
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    out = product(a, b, algorithm);
  }
  if (!dual) return out;
  const at::Tensor da = tangent_of(a), db = tangent_of(b);
  return with_tangent(out, sum_defined({da.defined() ? product(da, primal_of(b), algorithm)
                                                     : at::Tensor(),
                                        db.defined() ? product(primal_of(a), db, algorithm)
                                                     : at::Tensor()}));
}

// d act(x w^T + bias) = act'(pre) * (dx w^T + x dw^T + dbias), from primal values.
at::Tensor linear_tangent(const at::Tensor& x_dual, const at::Tensor& weight_dual,
                          const at::Tensor& bias_dual, c10::string_view activation,
                          c10::string_view algorithm) {
  const at::Tensor x = primal_of(x_dual), weight = primal_of(weight_dual);
  const at::Tensor dx = tangent_of(x_dual), dweight = tangent_of(weight_dual);
  const at::Tensor dbias = tangent_of(bias_dual);
  at::Tensor dpre = sum_defined(
      {dx.defined() ? linear_op(dx, weight, c10::nullopt, "none", algorithm) : at::Tensor(),
       dweight.defined() ? linear_op(x, dweight, c10::nullopt, "none", algorithm) : at::Tensor(),
       dbias});
  if (!dpre.defined()) return dpre;
  if (!dx.defined() && !dweight.defined()) {  // a bias tangent alone: broadcast to the output
    std::vector<c10::SymInt> out_sizes(x.sym_sizes().begin(), x.sym_sizes().end() - 1);
    out_sizes.push_back(weight.sym_size(0));
    dpre = dpre.expand_symint(out_sizes).contiguous();
  }
  const Activation act = parse_activation(activation);
  if (act == Activation::kNone) return dpre;
  const at::Tensor bias = primal_of(bias_dual);
  const at::Tensor pre = linear_op(
      x, weight, bias.defined() ? c10::optional<at::Tensor>(bias) : c10::nullopt, "none",
      algorithm);
  return activation_grad(dpre, pre, act);
}

// The operands' layouts are checked before a node of Function reads their sizes, which a
// strided nested tensor does not have: otherwise PyTorch's "NestedTensorImpl doesn't support
// sizes" answers, not the op's refusal.
at::Tensor matmul_autograd(const at::Tensor& a, const at::Tensor& b, c10::string_view algorithm) {
  check_strided(kMatmulOp, "a", a);
  check_strided(kMatmulOp, "b", b);
  return product_autograd<MatmulFunction>(matmul_op, a, b, algorithm);
}

at::Tensor linear_autograd(const at::Tensor& x, const at::Tensor& weight,
                           const c10::optional<at::Tensor>& bias, c10::string_view activation,
                           c10::string_view algorithm) {
  check_strided("mm_variants::linear", "x", x);
  check_strided("mm_variants::linear", "weight", weight);
  if (bias.has_value()) check_strided("mm_variants::linear", "bias", *bias);
  const at::Tensor bias_or_none = bias.value_or(at::Tensor());
  const bool dual = has_tangent({x, weight, bias_or_none});
  at::Tensor out;
  if (records_gradient({x, weight, bias_or_none})) {
    // With tangents, the primals, and the duals to save, as in product_autograd.
    const at::Tensor bias_in = dual ? primal_of(bias_or_none) : bias_or_none;
    out = LinearFunction::apply(
        dual ? primal_of(x) : x, dual ? primal_of(weight) : weight,
        bias_in.defined() ? c10::optional<at::Tensor>(bias_in) : c10::nullopt,
        std::string(activation), std::string(algorithm), ToSave{{x, weight, bias_or_none}});
  } else {
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    out = linear_op(x, weight, bias, activation, algorithm);
  }
  if (!dual) return out;
  return with_tangent(out, linear_tangent(x, weight, bias_or_none, activation, algorithm));
}

at::Tensor bmm_autograd(const at::Tensor& a, const at::Tensor& b, c10::string_view algorithm) {
  check_strided("mm_variants::bmm", "a", a);
  check_strided("mm_variants::bmm", "b", b);
  return product_autograd<BmmFunction>(bmm_op, a, b, algorithm);
}

}  // namespace
}  // namespace mm_variants

TORCH_LIBRARY_IMPL(mm_variants, Autograd, m) {
  m.impl("matmul", &mm_variants::matmul_autograd);
  m.impl("linear", &mm_variants::linear_autograd);
  m.impl("bmm", &mm_variants::bmm_autograd);
}
