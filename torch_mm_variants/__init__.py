"""torch_mm_variants: one matmul op, many kernels.

`torch.ops.mm_variants.matmul(a, b, algorithm)` is registered in C++ for the CPU and (when
built with CUDA) the GPU. Every kernel is one rung of a ladder from a naive loop to tensor
cores; `algorithms(device)` lists the rungs that exist for a device, in ladder order.
"""
from __future__ import annotations

import importlib.util

import torch
import torch.fx


def _load_failure(error: ImportError) -> str:
    """What to do when the compiled extension does not load: it is not built, or it was built
    against another torch (its C++ ABI changes between minor versions: undefined symbols)."""
    if importlib.util.find_spec(f"{__name__}._C") is None:
        return ("torch_mm_variants: the compiled extension (torch_mm_variants._C) is not built: "
                "run `python3 setup.py build_ext --inplace` in the source tree, or install the "
                "package with `pip install --no-build-isolation .`")
    return (f"torch_mm_variants: the compiled extension does not load with torch "
            f"{torch.__version__}. It must be built against the installed torch's minor version "
            f"(torch's C++ ABI changes between minor versions): build it again, e.g. `pip "
            f"install --no-build-isolation --force-reinstall .` or `python3 setup.py build_ext "
            f"--inplace`. The loader said: {error}")


try:
    from . import _C  # noqa: F401  (loads the library: registers mm_variants::matmul)
except ImportError as error:
    raise ImportError(_load_failure(error)) from error
from . import ops  # noqa: F401  (registers the fake kernels; the gradients are C++'s)
from .nn import Linear, check_matmul_operand, check_tensor, swap_linear
from .version import __version__
from .tuning import explain_auto, set_autotune

__all__ = ["matmul", "linear", "algorithms", "auto_choice", "explain_auto", "set_autotune",
           "has_cuda", "Linear", "swap_linear"]


def matmul(a: torch.Tensor, b: torch.Tensor, algorithm: str = "auto") -> torch.Tensor:
    """Returns a @ b for `a` [M, K] and `b` [K, N], computed by the kernel `algorithm`; or, for a
    batch `a` [B, M, K], each a[i] @ b[i] with `b` [B, K, N], or a[i] @ b with a shared `b` [K, N]
    (mm_variants::bmm).

    Any strides work (transposed views, slices with an offset); the result is a new contiguous
    tensor of the inputs' dtype, accumulated in float32 (float64 for float64 inputs).
    `algorithm="auto"` picks the best kernel for the inputs; see `auto_choice`.
    Differentiable, and traceable by torch.compile without graph breaks.
    """
    check_tensor("torch_mm_variants.matmul", "a", 1, a)
    check_tensor("torch_mm_variants.matmul", "b", 2, b)
    check_matmul_operand("torch_mm_variants.matmul", a)
    if a.dim() == 3:
        return torch.ops.mm_variants.bmm(a, b, algorithm)
    return torch.ops.mm_variants.matmul(a, b, algorithm)


# torch.fx.symbolic_trace records a call of matmul as one node: its choice between the two ops
# reads a.dim(), which a traced value cannot answer.
torch.fx.wrap("matmul")


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           activation: str = "none", algorithm: str = "auto") -> torch.Tensor:
    """activation(x @ weight.t() + bias) for x [..., K] and an nn.Linear weight [N, K].

    activation: "none", "relu", "gelu" (erf), "gelu_tanh" or "silu". Kernels that can fuse the
    bias and activation into their store do (the CPU's simd_packed and parallel, the GPU's
    tensor_core for x @ weight.t(), and wgmma there for a bias and relu); elsewhere they are
    applied to the fresh output in place. Differentiable and traceable like matmul.
    """
    check_tensor("torch_mm_variants.linear", "x", 1, x)
    check_tensor("torch_mm_variants.linear", "weight", 2, weight)
    if bias is not None:
        check_tensor("torch_mm_variants.linear", "bias", 3, bias)
    return torch.ops.mm_variants.linear(x, weight, bias, activation, algorithm)


def algorithms(device: str | torch.device = "cpu") -> list[str]:
    """The algorithm names that can run on `device` ("cpu", "cuda", "cuda:1", a torch.device),
    in ladder order. "auto" is accepted everywhere and is not listed."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None and torch.cuda.is_available():
        device = torch.device("cuda", torch.cuda.current_device())
    return list(_C.algorithms(str(device)))


def auto_choice(a: torch.Tensor, b: torch.Tensor) -> str:
    """The algorithm that algorithm="auto" runs for these inputs (see explain_auto for why)."""
    return explain_auto(a, b)["algorithm"]


def has_cuda() -> bool:
    """Whether this build of the extension contains the CUDA kernels."""
    return bool(_C.has_cuda())
