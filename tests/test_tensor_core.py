"""The tensor-core rung: its float32 policy (TF32 where allowed, else 3xTF32), proof that the
compiled kernels issue tensor-core instructions, and the paths the generic sweeps of
test_matmul.py do not force (16-byte copies with partial chunks at the edges, many tiles and K
steps). Misaligned views, streams, graph capture and 64-bit offsets are covered for every CUDA
rung in test_cuda_ladder_extras.py."""
from __future__ import annotations

import re

import pytest
import torch

import torch_mm_variants as mmv
from conftest import (TF32_TOLERANCE, assert_matches_reference, gpu_capability, kernel_sass,
                      launched_kernels, random_matrix, relative_error)

ALGORITHM = "tensor_core"

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(gpu_capability() < (8, 0),
                       reason="needs a CUDA build and a GPU of compute capability 8.0 or newer"),
]


def test_listed_on_sm80_and_newer():
    assert ALGORITHM in mmv.algorithms("cuda")


@pytest.fixture
def tf32_settings():
    """Restores the TF32 settings a test changes."""
    allow, precision = torch.backends.cuda.matmul.allow_tf32, torch.get_float32_matmul_precision()
    yield
    torch.set_float32_matmul_precision(precision)
    torch.backends.cuda.matmul.allow_tf32 = allow


def float32_inputs(m=200, n=150, k=300):
    torch.manual_seed(0)
    return torch.randn(m, k, device="cuda"), torch.randn(k, n, device="cuda")


def float32_error(a, b, algorithm=ALGORITHM):
    return relative_error(mmv.matmul(a, b, algorithm), a.double() @ b.double())


@pytest.mark.parametrize("m,n,k", [(200, 150, 300), (256, 256, 4096), (64, 64, 16384)])
def test_float32_keeps_float32_accuracy_without_tf32(tf32_settings, m, n, k):
    """With TF32 off (PyTorch's default), float32 runs in 3xTF32: errors of float32's size
    (torch.mm's own are a few 1e-7 at such K), a thousand times under TF32's."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    err = float32_error(*float32_inputs(m, n, k))
    assert err < 1e-6, f"relative error {err:.2e}"


@pytest.mark.parametrize("mn", [128, 1152], ids=["split-k", "whole-k"])
def test_3xtf32_sums_each_k_tile_afresh(tf32_settings, mn):
    """Positive inputs over a long K, where the tensor core's accumulation, which does not round
    to nearest, would drift in one chain of MMAs per output (to about 1e-5): each K tile's
    products are added to the sums in float32 instead. A 128 x 128 output splits K (16 ranges
    of 4096); 1152 x 1152 fills the SMs and runs all of K in each output's chain."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(0)
    a, b = torch.rand(mn, 65536, device="cuda"), torch.rand(65536, mn, device="cuda")
    err = float32_error(a, b)
    assert err < 2e-6, f"relative error {err:.2e}"


def kernel_names(run) -> list[str]:
    """The kernels that run() launches, without the test's output poisoning."""
    return [e["name"] for e in launched_kernels(run) if "FillFunctor" not in e["name"]]


SPLIT_DTYPES = [(torch.float32, False), (torch.float32, True), (torch.bfloat16, False),
                (torch.float16, False)]
SPLIT_IDS = ["3xtf32", "tf32", "bfloat16", "float16"]


@pytest.mark.parametrize("dtype,tf32", SPLIT_DTYPES, ids=SPLIT_IDS)
@pytest.mark.parametrize("a_layout,b_layout", [("row", "row"), ("row", "col"), ("col", "row"),
                                               ("col", "col")])
def test_outputs_of_few_tiles_split_k(tf32_settings, dtype, tf32, a_layout, b_layout):
    """Products whose tiles fill under half the SMs split K into ranges of whole K tiles (the last
    one shorter where they do not divide K): one launch of the ranges, each storing its sums in
    float32 whatever the dtype, then a pass that adds them in order and rounds once. Within the
    dtype's tolerance on sizes off the tile and range boundaries, every element written, the same
    bits on every run; a product that fills the SMs runs in one launch."""
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.manual_seed(0)
    for m, n, k in [(128, 4096, 4096), (65, 129, 4097), (200, 300, 1500), (1, 8, 2048)]:
        a = random_matrix(m, k, dtype, "cuda", a_layout)
        b = random_matrix(k, n, dtype, "cuda", b_layout)
        names = kernel_names(lambda: mmv.matmul(a, b, ALGORITHM))
        assert len(names) == 2, names
        assert {"KRanges" in name for name in names} == {True, False}, names
        assert any("sum_splits_kernel" in name for name in names), names
        assert_matches_reference(a, b, ALGORITHM)
        assert torch.equal(mmv.matmul(a, b, ALGORITHM), mmv.matmul(a, b, ALGORITHM))
    a = random_matrix(2048, 2048, dtype, "cuda", a_layout)
    b = random_matrix(2048, 2048, dtype, "cuda", b_layout)
    names = kernel_names(lambda: mmv.matmul(a, b, ALGORITHM))
    assert len(names) == 1 and "SingleEntry" in names[0], names


def test_16bit_split_k_keeps_the_ranges_sums_in_float32(tf32_settings):
    """A bf16 product split into 16 ranges of 512 whose own sums are large (about +-512) and
    cancel: kept in float32 they add up to the small result, where rounding each range's sum to
    bf16 would lose about 2 per range, more than the result itself."""
    torch.manual_seed(0)
    a = torch.ones(64, 8192, device="cuda", dtype=torch.bfloat16)
    sign = torch.ones(8192, 1, device="cuda")
    sign[4096:] = -1
    b = (sign + 0.05 * torch.randn(8192, 256, device="cuda")).to(torch.bfloat16)
    names = kernel_names(lambda: mmv.matmul(a, b, ALGORITHM))
    assert any("KRanges" in name for name in names), names
    err = relative_error(mmv.matmul(a, b, ALGORITHM), a.double() @ b.double())
    assert err < 1e-2, f"relative error {err:.2e}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("activation", ["none", "relu", "gelu"])
def test_linear_of_few_tiles_splits_k_through_its_epilogue(tf32_settings, dtype, activation):
    """mm_variants::linear at 128 tokens (the nn.Linear layout, whose bias and activation the
    kernel applies as it stores): the split K adds the ranges' sums and applies the bias and
    activation in the same pass."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(0)
    x = torch.randn(128, 4096, device="cuda", dtype=dtype)
    w = torch.randn(4096, 4096, device="cuda", dtype=dtype)
    bias = torch.randn(4096, device="cuda", dtype=dtype)
    run = lambda: mmv.linear(x, w, bias, activation=activation, algorithm=ALGORITHM)  # noqa: E731
    assert any("sum_splits_kernel" in name for name in kernel_names(run))
    reference = torch.nn.functional.linear(x.double(), w.double(), bias.double())
    reference = {"none": lambda t: t, "relu": torch.relu,
                 "gelu": torch.nn.functional.gelu}[activation](reference)
    err = relative_error(run(), reference)
    tolerance = 1e-6 if dtype == torch.float32 else 4e-3
    assert err < tolerance, f"relative error {err:.2e}"


def test_backward_after_tf32_is_switched_off(tf32_settings):
    """Gradients computed after TF32 was switched off run at float32's accuracy (3xTF32)."""
    torch.backends.cuda.matmul.allow_tf32 = True
    a, b = (t.requires_grad_() for t in float32_inputs())
    out = mmv.matmul(a, b, ALGORITHM)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    grad = torch.randn_like(out)
    out.backward(grad)
    assert relative_error(a.grad, grad.double() @ b.double().t()) < 1e-5
    assert relative_error(b.grad, a.double().t() @ grad.double()) < 1e-5


def test_linear_backward_with_activation_after_tf32_is_switched_off(tf32_settings):
    """A linear's backward recomputes its pre-activation output; after TF32 was switched off
    that product runs at float32's accuracy, and the gradients carry the forward's TF32 error."""
    torch.backends.cuda.matmul.allow_tf32 = True
    x, weight = (t.requires_grad_() for t in float32_inputs(m=64, n=96, k=80))
    out = mmv.linear(x, weight.t(), None, "gelu", ALGORITHM)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    grad = torch.randn_like(out)
    out.backward(grad)
    x64, w64 = x.detach().double().requires_grad_(), weight.detach().double().requires_grad_()
    torch.nn.functional.gelu(x64 @ w64).backward(grad.double())
    # The forward ran in TF32, so the gradients carry its error through the gelu's slope.
    assert relative_error(x.grad, x64.grad) < TF32_TOLERANCE
    assert relative_error(weight.grad, w64.grad) < TF32_TOLERANCE


@pytest.mark.parametrize("enable", ["allow_tf32", "precision_high", "precision_medium"])
def test_float32_runs_in_tf32_when_allowed(tf32_settings, enable):
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    if enable == "allow_tf32":
        torch.backends.cuda.matmul.allow_tf32 = True
    else:
        torch.set_float32_matmul_precision(enable.removeprefix("precision_"))
    a, b = float32_inputs()
    out = mmv.matmul(a, b, ALGORITHM)
    assert out.dtype == torch.float32
    err = relative_error(out, a.double() @ b.double())
    # TF32 keeps 10 mantissa bits: about 1e-3 relative error, far above float32's 1e-7.
    assert 1e-5 < err <= TF32_TOLERANCE, f"relative error {err:.2e}"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("a_layout,b_layout", [("row", "row"), ("row", "col"), ("col", "row"),
                                               ("col", "col")])
def test_16_byte_copies_with_partial_chunks(dtype, a_layout, b_layout):
    """Slices of 16-byte aligned buffers keep the fast cp.async path while their extents are not
    multiples of 8 elements, so the edge chunks are partial and must be zero-filled."""
    torch.manual_seed(0)

    def view(rows, cols, layout):
        if layout == "row":
            return torch.randn(rows, 64 * ((cols + 63) // 64), device="cuda").to(dtype)[:, :cols]
        return torch.randn(cols, 64 * ((rows + 63) // 64), device="cuda").to(dtype)[:, :rows].t()

    for m, n, k in [(37, 45, 29), (131, 263, 75), (300, 5, 301)]:
        assert_matches_reference(view(m, k, a_layout), view(k, n, b_layout), ALGORITHM)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_many_tiles_and_k_steps(dtype):
    """More tile rows than one group of the grouped tile order, a partial last group, and enough
    K steps to wrap the pipeline's stages several times; float32 in 3xTF32 here, and in TF32
    through its `tf32` variants in test_matmul.py."""
    torch.manual_seed(0)
    a = torch.randn(1300, 1000, device="cuda").to(dtype)
    b = torch.randn(1000, 700, device="cuda").to(dtype)
    assert_matches_reference(a, b, ALGORITHM)
    assert_matches_reference(a.t().contiguous().t(), b.t().contiguous().t(), ALGORITHM)


def test_kernels_use_tensor_cores():
    """Every compiled tensor_core kernel issues HMMA (mma.sync), LDSM (ldmatrix) and LDGSTS
    (cp.async) instructions."""
    kernels = kernel_sass("tensor_core_kernel")
    for name, body in kernels:
        for opcode in ("HMMA", "LDGSTS"):
            assert re.search(rf"\b{opcode}\b", body), f"{opcode} missing from {name}"
    assert any(re.search(r"\bLDSM\b", body) for _, body in kernels)


def test_auto_follows_the_tf32_setting(tf32_settings):
    """auto runs this rung for float32 either way, at the precision the setting asks for."""
    a, b = float32_inputs()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    assert mmv.auto_choice(a, b) == ALGORITHM
    assert float32_error(a, b, "auto") < 1e-6
    torch.backends.cuda.matmul.allow_tf32 = True
    assert mmv.auto_choice(a, b) == ALGORITHM
    assert 1e-5 < float32_error(a, b, "auto") <= TF32_TOLERANCE
