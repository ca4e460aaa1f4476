"""Python-side registrations of mm_variants::matmul: the fake kernel used by torch.compile and
the autograd formula. The kernels themselves are registered in C++ (csrc/)."""
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
