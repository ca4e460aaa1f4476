"""The fake kernels of mm_variants::matmul, linear and bmm: output shapes and input checks for
torch.compile's tracing. The kernels themselves and the gradient formulas are registered in C++
(csrc/, csrc/autograd.cpp)."""
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
