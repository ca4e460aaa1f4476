"""Batched products through mm_variants::bmm (torch_mm_variants.matmul with a 3-D a): per-entry
and shared b, every algorithm, odd sizes, gradients, opcheck and torch.compile."""
from __future__ import annotations

import pytest
import torch

import torch_mm_variants as mmv
from conftest import algorithm_dtype_params, assert_result, devices, relative_error, run_accepted


def reference(a, b):
    return a.double() @ b.double()


def check_bmm(a, b, algorithm):
    result = run_accepted(algorithm, a[0], b if b.dim() == 2 else b[0],
                          lambda: mmv.matmul(a, b, algorithm))
    if result is not None:
        assert_result(result[0], reference(a, b), a.dtype, a.device, result[1])


@pytest.mark.parametrize("device,algorithm,dtype", algorithm_dtype_params())
def test_batches(device, algorithm, dtype):
    torch.manual_seed(0)
    for batch, m, n, k in [(3, 5, 7, 9), (2, 33, 17, 65), (4, 1, 3, 1)]:  # M * N odd: padded
        a = torch.randn(batch, m, k, device=device).to(dtype)
        b = torch.randn(batch, k, n, device=device).to(dtype)
        check_bmm(a, b, algorithm)
        transposed = lambda t: t.transpose(1, 2).contiguous().transpose(1, 2)  # noqa: E731
        check_bmm(transposed(a), transposed(b), algorithm)
        check_bmm(a, b[0], algorithm)  # shared b
        w = torch.randn(n, k, device=device).to(dtype)
        check_bmm(a, w.t(), algorithm)  # shared nn.Linear weight, read in place


@pytest.mark.parametrize("device", devices())
def test_empty(device):
    empty_batch = mmv.matmul(torch.randn(0, 3, 4, device=device), torch.randn(0, 4, 5, device=device))
    assert empty_batch.shape == (0, 3, 5)
    out = mmv.matmul(torch.randn(2, 3, 0, device=device), torch.randn(2, 0, 5, device=device))
    assert torch.equal(out, torch.zeros(2, 3, 5, device=device))


def test_errors():
    with pytest.raises(RuntimeError, match=r"different batch sizes \(2 and 3\)"):
        mmv.matmul(torch.randn(2, 3, 4), torch.randn(3, 4, 5))
    with pytest.raises(RuntimeError, match=r"shapes cannot be multiplied \(\[2, 3, 4\] and \[2, 5, 6\]\)"):
        mmv.matmul(torch.randn(2, 3, 4), torch.randn(2, 5, 6))
    with pytest.raises(RuntimeError, match=r"b must be \[B, K, N\] or a shared \[K, N\], got a 1-D"):
        mmv.matmul(torch.randn(2, 3, 4), torch.randn(4))


@pytest.mark.parametrize("shared", [False, True])
def test_gradcheck(shared):
    a = torch.randn(3, 4, 5, dtype=torch.float64, requires_grad=True)
    b = torch.randn(*(() if shared else (3,)), 5, 2, dtype=torch.float64, requires_grad=True)
    fn = lambda a, b: mmv.matmul(a, b, "parallel")  # noqa: E731
    assert torch.autograd.gradcheck(fn, (a, b))
    assert torch.autograd.gradgradcheck(fn, (a, b))


@pytest.mark.parametrize("device", devices())
def test_opcheck_and_compile(device):
    a = torch.randn(3, 6, 5, device=device, requires_grad=True)
    b = torch.randn(3, 5, 4, device=device, requires_grad=True)
    torch.library.opcheck(torch.ops.mm_variants.bmm.default, (a, b, "auto"))
    torch.library.opcheck(torch.ops.mm_variants.bmm.default, (a, b[0], "auto"))
    torch._dynamo.reset()
    compiled = torch.compile(lambda a, b: mmv.matmul(a, b).relu(), fullgraph=True, dynamic=True)
    for batch in [2, 5]:
        x, y = torch.randn(batch, 7, 5, device=device), torch.randn(batch, 5, 3, device=device)
        assert relative_error(compiled(x, y), reference(x, y).relu()) < 1e-5
