"""Bad input is refused with a precise message, never a crash or a wrong result."""
from __future__ import annotations

import pytest
import torch

import torch_mm_variants as mmv


def raises(match):
    return pytest.raises(RuntimeError, match=match)


def test_not_a_matrix():
    with raises(r"a must be a matrix, got a 3-D tensor"):  # the op; the wrapper batches 3-D
        torch.ops.mm_variants.matmul(torch.randn(2, 3, 4), torch.randn(4, 5))
    with raises(r"a must be a matrix, got a 4-D tensor"):
        mmv.matmul(torch.randn(2, 2, 3, 4), torch.randn(4, 5))
    with raises(r"b must be a matrix, got a 1-D tensor"):
        mmv.matmul(torch.randn(2, 3), torch.randn(3))


def test_shapes_cannot_be_multiplied():
    with raises(r"shapes cannot be multiplied \(2x3 and 4x5\)"):
        mmv.matmul(torch.randn(2, 3), torch.randn(4, 5))


def test_different_dtypes():
    with raises(r"same dtype, but got: Float != Double"):
        mmv.matmul(torch.randn(2, 3), torch.randn(3, 4, dtype=torch.float64))


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.bool, torch.complex64, torch.uint8])
def test_unsupported_dtype(dtype):
    a = torch.ones(2, 3, dtype=dtype)
    with raises(r"unsupported dtype"):
        mmv.matmul(a, torch.ones(3, 4, dtype=dtype))


def test_unknown_algorithm_lists_valid_ones():
    valid = ", ".join(["auto"] + mmv.algorithms("cpu"))
    with raises(rf"unknown algorithm 'fastest' for cpu; valid algorithms: {valid}"):
        mmv.matmul(torch.randn(2, 3), torch.randn(3, 4), "fastest")


@pytest.mark.skipif(not (mmv.has_cuda() and torch.cuda.is_available()), reason="needs a GPU")
def test_different_devices():
    with raises(r"same device, but found"):
        mmv.matmul(torch.randn(2, 3, device="cuda"), torch.randn(3, 4))
    with raises(r"same device, but found"):
        mmv.matmul(torch.randn(2, 3), torch.randn(3, 4, device="cuda"))


@pytest.mark.skipif(not (mmv.has_cuda() and torch.cuda.is_available()), reason="needs a GPU")
def test_float64_on_cuda_is_refused_by_name():
    a = torch.randn(4, 4, device="cuda", dtype=torch.float64)
    name = mmv.algorithms("cuda")[0]
    with raises(rf"algorithm '{name}' does not support dtype Double on cuda; it supports: "):
        mmv.matmul(a, a, name)
    with raises(r"no algorithm on cuda:0 supports dtype Double"):
        mmv.matmul(a, a)


def test_algorithms_listing():
    names = mmv.algorithms("cpu")
    assert names[:2] == ["naive", "coalescing"]
    assert mmv.algorithms(torch.device("cpu")) == names
    assert len(set(names)) == len(names) and "auto" not in names
    if not mmv.has_cuda():
        assert mmv.algorithms("cuda") == []
