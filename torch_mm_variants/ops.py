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
    _C.check_dtype_and_algorithm("mm_variants::matmul", a.dtype, a.device, algorithm)
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
    _C.check_dtype_and_algorithm("mm_variants::linear", x.dtype, x.device, algorithm)
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
    # bmm's eager kernel checks the rest as one product's, with matmul's checks in its own name.
    _check_same_kind("bmm", "a and b", a, b)
    _C.check_dtype_and_algorithm("mm_variants::bmm", a.dtype, a.device, algorithm)
    return a.new_empty((a.shape[0], a.shape[1], b.shape[-1]))


# vmap rules: a vmapped product runs as one batched product (mm_variants::bmm, or linear's leading
# dimensions) instead of PyTorch's fallback, which calls the op once per entry and warns.

def _batch_first(t: torch.Tensor, dim, size: int) -> torch.Tensor:
    """t with its vmapped dimension first; an unbatched t repeated `size` times (a stride-0
    view)."""
    return t.movedim(dim, 0) if dim is not None else t.expand(size, *t.shape)


def _entry(t, dim, v: int):
    """Entry v of t's vmapped dimension `dim`; t itself where it is unbatched (or None)."""
    return t if dim is None or t is None else t.select(dim, v)


def _per_entry(op, size: int, inputs, in_dims, *options) -> torch.Tensor:
    """op on each of the `size` entries of the batched inputs, stacked; with none, an empty
    batch of the shape op's fake kernel gives an entry."""
    if size == 0:
        entries = [None if t is None else
                   torch.empty(t.shape if d is None else t.shape[:d] + t.shape[d + 1:],
                               dtype=t.dtype, device="meta") for t, d in zip(inputs, in_dims)]
        return inputs[0].new_empty((0, *op(*entries, *options).shape))
    outs = [op(*(_entry(t, d, v) for t, d in zip(inputs, in_dims)), *options) for v in range(size)]
    return torch.stack(outs)


def _entry_shape(t: torch.Tensor, dim) -> tuple:
    """The shape of each vmapped entry of t (vmapped at `dim`, or None)."""
    return tuple(t.shape) if dim is None else tuple(t.shape[:dim] + t.shape[dim + 1:])


# Whether one entry's operands pass the op's shape checks. The rules below batch only entries
# that do: batched, others could pass the batched op's checks (a batched 1-D b looks like one
# shared matrix, a batch of scalars x like one row) or fail them with the sizes of the whole
# batch, which the caller never passed. One by one, the op refuses them as in eager mode.

def _matmul_entries_fit(a: tuple, b: tuple) -> bool:
    return len(a) == 2 and len(b) == 2 and a[1] == b[0]


def _bmm_entries_fit(a: tuple, b: tuple) -> bool:
    return (len(a) == 3 and len(b) in (2, 3) and (len(b) == 2 or b[0] == a[0])
            and a[2] == b[-2])


@torch.library.register_vmap("mm_variants::matmul")
def _matmul_vmap(info, in_dims, a, b, algorithm="auto"):
    """One bmm of every entry's product, an unbatched b shared. Entries that matmul refuses run
    one by one, so that it refuses them as it does in eager mode."""
    a_dim, b_dim = in_dims[0], in_dims[1]
    if not _matmul_entries_fit(_entry_shape(a, a_dim), _entry_shape(b, b_dim)):
        return _per_entry(torch.ops.mm_variants.matmul, info.batch_size, (a, b), in_dims,
                          algorithm), 0
    a_batch = _batch_first(a, a_dim, info.batch_size)
    b_batch = b if b_dim is None else b.movedim(b_dim, 0)  # an unbatched b is shared
    return torch.ops.mm_variants.bmm(a_batch, b_batch, algorithm), 0


@torch.library.register_vmap("mm_variants::bmm")
def _bmm_vmap(info, in_dims, a, b, algorithm="auto"):
    """V entries of batches of B products: one bmm of V * B products where a is batched and b is
    either shared by all of them or batched too; otherwise, or where bmm refuses the entries, one
    bmm per entry (no copies of an operand that all entries share)."""
    a_dim, b_dim = in_dims[0], in_dims[1]
    size = info.batch_size
    fit = _bmm_entries_fit(_entry_shape(a, a_dim), _entry_shape(b, b_dim))
    if fit and a_dim is not None and (b_dim is not None and b.dim() == 4 or b_dim is None
                                      and b.dim() == 2):
        a_batch = a.movedim(a_dim, 0)
        b_flat = b if b_dim is None else b.movedim(b_dim, 0).flatten(0, 1)
        out = torch.ops.mm_variants.bmm(a_batch.flatten(0, 1), b_flat, algorithm)
        return out.unflatten(0, (size, a_batch.shape[1])), 0
    return _per_entry(torch.ops.mm_variants.bmm, size, (a, b), (a_dim, b_dim), algorithm), 0


@torch.library.register_vmap("mm_variants::linear")
def _linear_vmap(info, in_dims, x, weight, bias=None, activation="none", algorithm="auto"):
    """A vmapped x is one more leading dimension, which linear takes as it is; per-entry weights
    or biases, and x entries that linear refuses (scalars, a wrong K), run one linear per
    entry."""
    x_dim, weight_dim, bias_dim = (*in_dims, None)[:3]  # in_dims has no entry for an omitted bias
    x_entry = _entry_shape(x, x_dim)
    if (weight_dim is None and bias_dim is None and len(x_entry) >= 1
            and (weight.dim() != 2 or x_entry[-1] == weight.shape[1])):
        return torch.ops.mm_variants.linear(x.movedim(x_dim, 0), weight, bias, activation,
                                            algorithm), 0
    return _per_entry(torch.ops.mm_variants.linear, info.batch_size, (x, weight, bias),
                      (x_dim, weight_dim, bias_dim), activation, algorithm), 0


# A jagged nested tensor is a Python subclass. Under torch.inference_mode no autograd kernel
# checks the operands first, and the call would reach the subclass's __torch_dispatch__ and its
# bare NotImplementedError; this rule refuses it by name there, as the ops refuse a strided one.

_OPERAND_NAMES = {"matmul": ("a", "b"), "bmm": ("a", "b"), "linear": ("x", "weight", "bias")}


def _refuse_nested(op: str):
    def rule(_mode, _func, _types, args, kwargs):
        operands = dict(zip(_OPERAND_NAMES[op], args), **kwargs)
        for name in _OPERAND_NAMES[op]:
            if isinstance(operands.get(name), torch.Tensor):
                _C.check_strided(f"mm_variants::{op}", name, operands[name])
        raise AssertionError(f"mm_variants::{op} reached the nested tensors' rule without a "
                             "nested operand")
    return rule


try:
    from torch.nested._internal.nested_tensor import NestedTensor as _JaggedNestedTensor
except ImportError:  # a PyTorch without jagged nested tensors has none to refuse
    _JaggedNestedTensor = None
if _JaggedNestedTensor is not None:
    for _op in _OPERAND_NAMES:
        torch.library.register_torch_dispatch(f"mm_variants::{_op}",
                                              _JaggedNestedTensor)(_refuse_nested(_op))
