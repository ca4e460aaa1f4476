"""Products whose operands or output hold more than 2**31 elements, on every CUDA algorithm and
auto, through matmul, linear (whose bias may be added in the kernel's store) and bmm (whose
batch may run in one launch): each element's offset past int32's range must be computed in 64
bits, in every rung's loads and stores. The CPU kernels index with int64_t throughout; their
speed would make these sizes take hours there.

The output is poisoned (NaN) before each run, so an element not written fails; blocks at its
four corners, which include the elements past 2**31, are compared with a float64 reference.
Each test walks the algorithms in turn, freeing each product before the next, and holds a file
lock shared by the test workers (pytest -n), so that one product's 4-13 GB at most is held at a
time."""
from __future__ import annotations

import fcntl
import gc

import pytest
import torch

import torch_mm_variants as mmv
from conftest import DTYPE_BY_C10_NAME, gpu_available, relative_error, run_accepted, run_checked

pytestmark = pytest.mark.skipif(not gpu_available(), reason="the CUDA kernels need a GPU")


@pytest.fixture(autouse=True)
def one_at_a_time(tmp_path_factory):
    """Runs this file's tests one at a time across pytest-xdist's workers, whose temporary
    folders share a parent."""
    with open(tmp_path_factory.getbasetemp().parent / "large_offsets.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


INT32_LIMIT = 2**31
# (M, N, K, how b is given): each puts one tensor past 2**31 elements.
CASES = [
    (65536 + 3, 32768 + 5, 40, "row"),  # the output: 2,147,942,415 elements
    (2**20 + 1, 8, 2048 + 8, "row"),  # a: 2,155,874,344 elements
    (8, 2**19 + 8, 4096 + 8, "weight"),  # b as an nn.Linear weight's w.t() (decode shape)
]
CORNER = 64  # rows and columns of each corner block checked against float64


def operands(m, n, k, layout, dtype):
    a = torch.randn(m, k, device="cuda", dtype=dtype)
    if layout == "weight":
        return a, torch.randn(n, k, device="cuda", dtype=dtype).t()
    return a, torch.randn(k, n, device="cuda", dtype=dtype)


def corners(extent):
    return [slice(0, min(CORNER, extent)), slice(max(0, extent - CORNER), extent)]


def corner_errors(out, product):
    """Relative error against float64 of each corner block of `out`, where product(rows, cols)
    is that block of the exact result."""
    return [relative_error(out[rows, cols], product(rows, cols))
            for rows in corners(out.shape[0]) for cols in corners(out.shape[1])]


def check_output(result, shape, dtype, product):
    """None if run_checked's `result` is right (or the algorithm refused by design), else what
    is wrong with it."""
    if result is None:
        return None
    out, tolerance = result
    if out.shape != shape or out.dtype != dtype:
        return f"output {tuple(out.shape)} {out.dtype}"
    if torch.isnan(out).any().item():
        return "unwritten (NaN-poisoned) or NaN elements"
    worst = max(corner_errors(out, product))
    return None if worst <= tolerance else f"relative error {worst:.2e} > {tolerance:.0e}"


def check_matmul(m, n, k, layout, dtype, algorithm):
    a, b = operands(m, n, k, layout, dtype)
    assert max(a.numel(), b.numel(), m * n) > INT32_LIMIT
    return check_output(run_checked(a, b, algorithm), (m, n), dtype,
                        lambda rows, cols: a[rows].double() @ b[:, cols].double())


def check_linear(m, n, k, dtype, algorithm):
    """x @ w.t() + bias with an output past 2**31 elements."""
    x, w = operands(m, n, k, "weight", dtype)
    w = w.t()
    bias = torch.randn(n, device="cuda", dtype=dtype)
    result = run_accepted(algorithm, x, w.t(), lambda: mmv.linear(x, w, bias, algorithm=algorithm))
    return check_output(result, (m, n), dtype, lambda rows, cols: (
        x[rows].double() @ w[cols].double().t() + bias[cols].double()))


def check_bmm(batch, m, n, k, dtype, algorithm):
    """A batch whose output holds more than 2**31 elements; its last entry lies past them."""
    a = torch.randn(batch, m, k, device="cuda", dtype=dtype)
    b = torch.randn(batch, k, n, device="cuda", dtype=dtype)
    result = run_accepted(algorithm, a[0], b[0], lambda: mmv.matmul(a, b, algorithm))
    if result is None:
        return None
    out, tolerance = result
    if out.shape != (batch, m, n):
        return f"output {tuple(out.shape)}"
    return check_output((out[-1], tolerance), (m, n), dtype,
                        lambda rows, cols: a[-1, rows].double() @ b[-1, :, cols].double())


def dtypes_of(algorithm):
    if algorithm == "auto":
        return [torch.bfloat16, torch.float32]
    return [DTYPE_BY_C10_NAME[t] for t in mmv._C.algorithm_dtypes("cuda", algorithm)
            if DTYPE_BY_C10_NAME[t] in (torch.bfloat16, torch.float32)]


def failures_of(check):
    """check(algorithm, dtype) for every CUDA algorithm and auto, each of bf16 and float32 that
    it takes: the problems found, each named."""
    failures = []
    for algorithm in ["auto", *mmv.algorithms("cuda")]:
        for dtype in dtypes_of(algorithm):
            problem = check(algorithm, dtype)
            if problem is not None:
                failures.append(f"{algorithm} {dtype}: {problem}")
            gc.collect()
            torch.cuda.empty_cache()
    return failures


@pytest.mark.parametrize("m,n,k,layout", CASES)
def test_matmul_offsets_past_int32(m, n, k, layout):
    failures = failures_of(lambda algorithm, dtype: check_matmul(m, n, k, layout, dtype, algorithm))
    assert not failures, "\n".join(failures)


def test_linear_offsets_past_int32():
    m, n, k, _ = CASES[0]
    failures = failures_of(lambda algorithm, dtype: check_linear(m, n, k, dtype, algorithm))
    assert not failures, "\n".join(failures)


def test_bmm_offsets_past_int32():
    failures = failures_of(lambda algorithm, dtype: check_bmm(3, 32768 + 1, 32768, 40, dtype,
                                                               algorithm))
    assert not failures, "\n".join(failures)
