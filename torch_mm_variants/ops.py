"""Python-side registrations of mm_variants::matmul and mm_variants::linear: the fake kernels
used by torch.compile and the autograd formulas. The kernels themselves are registered in C++
(csrc/)."""
from __future__ import annotations

import torch


@torch.library.register_fake("mm_variants::matmul")
def _matmul_fake(a: torch.Tensor, b: torch.Tensor, algorithm: str = "auto") -> torch.Tensor:
    torch._check(a.dim() == 2, lambda: f"mm_variants::matmul: a must be a matrix, got a {a.dim()}-D tensor")
    torch._check(b.dim() == 2, lambda: f"mm_variants::matmul: b must be a matrix, got a {b.dim()}-D tensor")
    torch._check(
        a.shape[1] == b.shape[0],
        lambda: "mm_variants::matmul: a and b shapes cannot be multiplied "
        f"({a.shape[0]}x{a.shape[1]} and {b.shape[0]}x{b.shape[1]})",
    )
    torch._check(
        a.dtype == b.dtype,
        lambda: f"mm_variants::matmul: expected a and b to have the same dtype, but got: {a.dtype} != {b.dtype}",
    )
    return a.new_empty((a.shape[0], b.shape[1]))


def _setup_context(ctx, inputs, output):
    a, b, algorithm = inputs
    ctx.algorithm = algorithm
    ctx.save_for_backward(
        a if ctx.needs_input_grad[1] else None,
        b if ctx.needs_input_grad[0] else None,
    )


def _backward(ctx, grad):
    # d(a @ b)/da = grad @ b^T and d/db = a^T @ grad, through the same op and algorithm: the
    # transposed views are read in place by every kernel, so no copies are made.
    a, b = ctx.saved_tensors
    grad_a = grad_b = None
    if ctx.needs_input_grad[0]:
        grad_a = torch.ops.mm_variants.matmul(grad, b.t(), ctx.algorithm)
    if ctx.needs_input_grad[1]:
        grad_b = torch.ops.mm_variants.matmul(a.t(), grad, ctx.algorithm)
    return grad_a, grad_b, None


torch.library.register_autograd("mm_variants::matmul", _backward, setup_context=_setup_context)


ACTIVATIONS = ("none", "relu", "gelu", "gelu_tanh", "silu")


@torch.library.register_fake("mm_variants::linear")
def _linear_fake(x, weight, bias=None, activation="none", algorithm="auto"):
    torch._check(weight.dim() == 2, lambda: "mm_variants::linear: weight must be a matrix [N, K]")
    torch._check(x.dim() >= 1, lambda: "mm_variants::linear: x must have at least one dimension")
    torch._check(
        x.shape[-1] == weight.shape[1],
        lambda: "mm_variants::linear: x and weight shapes cannot be multiplied "
        f"({list(x.shape)} and {list(weight.shape)}^T)",
    )
    torch._check(activation in ACTIVATIONS,
                 lambda: f"mm_variants::linear: unknown activation '{activation}'")
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def _activation_grad(grad, pre, activation):
    """grad * activation'(pre), written with differentiable torch ops (double backward works)."""
    if activation == "relu":
        return grad * (pre > 0).to(grad.dtype)
    if activation == "silu":
        s = torch.sigmoid(pre)
        return grad * s * (1 + pre * (1 - s))
    if activation == "gelu":
        cdf = 0.5 * (1 + torch.erf(pre * 0.7071067811865476))
        pdf = torch.exp(-0.5 * pre * pre) * 0.3989422804014327
        return grad * (cdf + pre * pdf)
    if activation == "gelu_tanh":
        inner = 0.7978845608028654 * (pre + 0.044715 * pre ** 3)
        t = torch.tanh(inner)
        d_inner = 0.7978845608028654 * (1 + 3 * 0.044715 * pre * pre)
        return grad * (0.5 * (1 + t) + 0.5 * pre * (1 - t * t) * d_inner)
    return grad


def _as_rows(t):
    """[..., C] -> [rows, C] (also when C or the row count is 0, where reshape(-1, C) fails)."""
    return t.flatten(0, -2) if t.dim() > 1 else t.unsqueeze(0)


def _linear_setup_context(ctx, inputs, output):
    x, weight, bias, activation, algorithm = inputs
    ctx.activation, ctx.algorithm, ctx.has_bias = activation, algorithm, bias is not None
    ctx.save_for_backward(x, weight, bias)


def _linear_backward(ctx, grad):
    # With an activation, the pre-activation output is recomputed (one extra matmul) rather
    # than kept alive from the forward pass.
    x, weight, bias = ctx.saved_tensors
    rows, grad_rows = _as_rows(x), _as_rows(grad)
    if ctx.activation != "none":
        pre = torch.ops.mm_variants.linear(x, weight, bias, "none", ctx.algorithm)
        grad_rows = _activation_grad(grad_rows, _as_rows(pre), ctx.activation)
    grad_x = grad_weight = grad_bias = None
    if ctx.needs_input_grad[0]:
        grad_x = torch.ops.mm_variants.matmul(grad_rows, weight, ctx.algorithm).reshape(x.shape)
    if ctx.needs_input_grad[1]:
        grad_weight = torch.ops.mm_variants.matmul(grad_rows.t(), rows, ctx.algorithm)
    if ctx.has_bias and ctx.needs_input_grad[2]:
        grad_bias = grad_rows.sum(0)
    return grad_x, grad_weight, grad_bias, None, None


torch.library.register_autograd("mm_variants::linear", _linear_backward,
                                setup_context=_linear_setup_context)


@torch.library.register_fake("mm_variants::bmm")
def _bmm_fake(a, b, algorithm="auto"):
    torch._check(a.dim() == 3, lambda: "mm_variants::bmm: a must be a batch of matrices [B, M, K]")
    torch._check(b.dim() in (2, 3), lambda: "mm_variants::bmm: b must be [B, K, N] or a shared [K, N]")
    torch._check(b.dim() == 2 or b.shape[0] == a.shape[0],
                 lambda: "mm_variants::bmm: a and b have different batch sizes")
    torch._check(a.shape[2] == b.shape[-2],
                 lambda: f"mm_variants::bmm: a and b shapes cannot be multiplied "
                 f"({list(a.shape)} and {list(b.shape)})")
    return a.new_empty((a.shape[0], a.shape[1], b.shape[-1]))


def _bmm_setup_context(ctx, inputs, output):
    a, b, algorithm = inputs
    ctx.algorithm = algorithm
    ctx.save_for_backward(a if ctx.needs_input_grad[1] else None,
                          b if ctx.needs_input_grad[0] else None)


def _bmm_backward(ctx, grad):
    a, b = ctx.saved_tensors
    grad_a = grad_b = None
    if ctx.needs_input_grad[0]:  # grad @ b^T, per entry (b^T shared when b is)
        grad_a = torch.ops.mm_variants.bmm(grad, b.transpose(-1, -2), ctx.algorithm)
    if ctx.needs_input_grad[1]:
        if b.dim() == 3:  # a^T @ grad, per entry
            grad_b = torch.ops.mm_variants.bmm(a.transpose(1, 2), grad, ctx.algorithm)
        else:  # a shared b gathers the gradient of every entry: one product over all rows
            grad_b = torch.ops.mm_variants.matmul(_as_rows(a).t(), _as_rows(grad), ctx.algorithm)
    return grad_a, grad_b, None


torch.library.register_autograd("mm_variants::bmm", _bmm_backward, setup_context=_bmm_setup_context)
