"""Shared test helpers: the devices and algorithms to cover (from the registry), a float64
reference, tolerances, and output poisoning."""
from __future__ import annotations

import pytest
import torch

import torch_mm_variants as mmv

DTYPE_BY_C10_NAME = {"Float": torch.float32, "Half": torch.float16, "BFloat16": torch.bfloat16,
                     "Double": torch.float64}
# Worst-case ||out - ref|| / ||ref|| against a float64 product of the same (rounded) inputs.
TOLERANCE = {torch.float64: 1e-12, torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 1e-2}
TF32_TOLERANCE = 5e-3


def gpu_available() -> bool:
    return mmv.has_cuda() and torch.cuda.is_available()


def devices() -> list[str]:
    return ["cpu"] + (["cuda"] if gpu_available() else [])


def algorithm_params() -> list:
    """(device, algorithm) for every registered algorithm; CUDA entries exist only on a GPU."""
    return [pytest.param(d, name, id=f"{d}-{name}") for d in devices() for name in mmv.algorithms(d)]


def algorithm_dtype_params() -> list:
    return [pytest.param(d, name, DTYPE_BY_C10_NAME[t], id=f"{d}-{name}-{t}")
            for d in devices() for name in mmv.algorithms(d)
            for t in mmv._C.algorithm_dtypes(d, name)]


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    scale = ref.norm().item()
    diff = (out.double() - ref).norm().item()
    return diff / scale if scale > 0 else diff


def random_matrix(rows, cols, dtype, device, layout="row"):
    """A random [rows, cols] matrix: row-major, a transposed view ("col"), or a slice with a
    storage offset and a padded row stride ("sliced")."""
    if layout == "row":
        return torch.randn(rows, cols, device=device).to(dtype)
    if layout == "col":
        return torch.randn(cols, rows, device=device).to(dtype).t()
    if layout == "sliced":
        return torch.randn(rows + 1, cols + 3, device=device).to(dtype)[1:, 2:2 + cols]
    raise ValueError(layout)


def run_checked(a, b, algorithm):
    """Runs the op and returns (out, tolerance). Float32 on a TF32 tensor-core rung is refused
    unless TF32 is allowed (checked here), then run with TF32 and its looser tolerance."""
    try:
        return mmv.matmul(a, b, algorithm), TOLERANCE[a.dtype]
    except RuntimeError as error:
        if a.dtype != torch.float32 or "allow_tf32" not in str(error):
            raise
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        return mmv.matmul(a, b, algorithm), TF32_TOLERANCE
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous


def assert_matches_reference(a, b, algorithm):
    out, tolerance = run_checked(a, b, algorithm)
    ref = a.double() @ b.double()
    assert out.shape == ref.shape and out.dtype == a.dtype and out.device == a.device
    assert out.is_contiguous()
    assert not torch.isnan(out).any(), "unwritten (NaN-poisoned) or NaN elements in the output"
    err = relative_error(out, ref)
    assert err <= tolerance, f"relative error {err:.3e} > {tolerance:.0e}"


@pytest.fixture(autouse=True)
def poison_outputs():
    """Every output starts as NaN, so an element a kernel does not write fails the test."""
    mmv._C.set_poison_outputs(True)
    yield
    mmv._C.set_poison_outputs(False)
