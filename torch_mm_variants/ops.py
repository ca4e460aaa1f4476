"""The fake kernels of mm_variants::matmul, linear and bmm: output shapes and input checks for
torch.compile's tracing. The kernels themselves and the gradient formulas are registered in C++
(csrc/, csrc/autograd.cpp).

Each fake kernel refuses what its eager kernel refuses, in the same order and with the same
message, so that a compiled function fails while tracing rather than at its first run. The checks
of sizes, and of operands that differ in dtype or device, are written here in eager's words
(torch._check, which takes symbolic sizes too; tests/test_errors.py compares every message with
eager's); whether the dtype is supported and the algorithm name exists and takes it, eager's own
code checks, through _C. Nothing reads tensor data. What an algorithm refuses for the inputs'
sizes or the settings of the run (its `accepts`) is left to the run.
"""
from __future__ import annotations

import torch

from . import _C

ACTIVATIONS = ("none", "relu", "gelu", "gelu_tanh", "silu")


def _check_same_kind(op: str, names: str, x: torch.Tensor, y: torch.Tensor) -> None:
    """One dtype and one device for two operands (`names` e.g. "a and b")."""
    torch._check(x.dtype == y.dtype, lambda: f"mm_variants::{op}: expected {names} to have the "
                 f"same dtype, but got: {_C.dtype_name(x.dtype)} != {_C.dtype_name(y.dtype)}")
    torch._check(x.device == y.device, lambda: f"mm_variants::{op}: expected {names} on the same "
                 f"device, but found {x.device} and {y.device}")


@torch.library.register_fake("mm_variants::matmul")
def _matmul_fake(a: torch.Tensor, b: torch.Tensor, algorithm: str = "auto") -> torch.Tensor:
    torch._check(a.dim() == 2, lambda: f"mm_variants::matmul: a must be a matrix, got a {a.dim()}-D tensor")
    torch._check(b.dim() == 2, lambda: f"mm_variants::matmul: b must be a matrix, got a {b.dim()}-D tensor")
    torch._check(
        a.shape[1] == b.shape[0],
        lambda: "mm_variants::matmul: a and b shapes cannot be multiplied "
        f"({a.shape[0]}x{a.shape[1]} and {b.shape[0]}x{b.shape[1]})",
    )
    _check_same_kind("matmul", "a and b", a, b)
    _C.check_dtype_and_algorithm(a.dtype, a.device, algorithm)
    return a.new_empty((a.shape[0], b.shape[1]))


def _check_bias(bias: torch.Tensor, weight: torch.Tensor) -> None:
    def wrong_shape() -> str:
        return (f"mm_variants::linear: bias must have shape [{weight.shape[0]}], "
                f"got {list(bias.shape)}")

    torch._check(bias.dim() == 1, wrong_shape)
    torch._check(bias.shape[0] == weight.shape[0], wrong_shape)
    torch._check(bias.dtype == weight.dtype, lambda: "mm_variants::linear: expected bias to have "
                 f"the dtype of weight, but got: {_C.dtype_name(bias.dtype)} != "
                 f"{_C.dtype_name(weight.dtype)}")
    torch._check(bias.device == weight.device, lambda: "mm_variants::linear: expected bias on the "
                 f"device of weight, but found {bias.device} and {weight.device}")


@torch.library.register_fake("mm_variants::linear")
def _linear_fake(x, weight, bias=None, activation="none", algorithm="auto"):
    torch._check(weight.dim() == 2, lambda: "mm_variants::linear: weight must be a matrix [N, K], "
                 f"got a {weight.dim()}-D tensor")
    torch._check(x.dim() >= 1, lambda: "mm_variants::linear: x must have at least one dimension")
    _check_same_kind("linear", "x and weight", x, weight)
    torch._check(
        x.shape[-1] == weight.shape[1],
        lambda: "mm_variants::linear: x and weight shapes cannot be multiplied "
        f"({list(x.shape)} and {list(weight.shape)}^T)",
    )
    if bias is not None:
        _check_bias(bias, weight)
    torch._check(activation in ACTIVATIONS, lambda: f"mm_variants::linear: unknown activation "
                 f"'{activation}'; valid: {', '.join(ACTIVATIONS)}")
    _C.check_dtype_and_algorithm(x.dtype, x.device, algorithm)
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


@torch.library.register_fake("mm_variants::bmm")
def _bmm_fake(a, b, algorithm="auto"):
    torch._check(a.dim() == 3, lambda: "mm_variants::bmm: a must be a batch of matrices [B, M, K], "
                 f"got a {a.dim()}-D tensor")
    torch._check(b.dim() in (2, 3), lambda: "mm_variants::bmm: b must be [B, K, N] or a shared "
                 f"[K, N], got a {b.dim()}-D tensor")
    torch._check(b.dim() == 2 or b.shape[0] == a.shape[0],
                 lambda: "mm_variants::bmm: a and b have different batch sizes "
                 f"({a.shape[0]} and {b.shape[0]})")
    torch._check(a.shape[2] == b.shape[-2],
                 lambda: f"mm_variants::bmm: a and b shapes cannot be multiplied "
                 f"({list(a.shape)} and {list(b.shape)})")
    # bmm's eager kernel checks the rest as one product's: with matmul's messages.
    _check_same_kind("matmul", "a and b", a, b)
    _C.check_dtype_and_algorithm(a.dtype, a.device, algorithm)
    return a.new_empty((a.shape[0], a.shape[1], b.shape[-1]))
