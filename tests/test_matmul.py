"""Correctness of every registered algorithm against a float64 reference: every dtype it
accepts, the four transpose layouts, slices with offsets, and sizes just off tile boundaries."""
from __future__ import annotations

import pytest
import torch

import torch_mm_variants as mmv
from conftest import (algorithm_dtype_params, algorithm_params, assert_matches_reference, devices,
                      random_matrix, relative_error, rows_accepted, run_checked)

EDGE_SIZES = [1, 7, 31, 33, 63, 65, 127, 129]
GPU_EDGE_SIZES = EDGE_SIZES + [64, 255, 257, 1000, 1025]
BASE = 61  # the other two dimensions while one is swept (under the skinny kernel's 64 rows)
LAYOUTS = [("row", "row"), ("row", "col"), ("col", "row"), ("col", "col")]


def sweep(device: str, algorithm: str, dtype: torch.dtype) -> list[tuple[int, int, int]]:
    """Sizes varying one of M, N, K at a time around BASE. While N or K varies, M is BASE or as
    many rows as `algorithm` takes (rows_accepted): a rung made for a few tokens (skinny_gemv
    takes 16) then meets every edge size of N and K, not only those of the M sweep's M = 1 and
    7."""
    sizes = GPU_EDGE_SIZES if device == "cuda" else EDGE_SIZES

    def rows(n: int, k: int) -> int:
        return rows_accepted(algorithm, BASE, k, n, dtype, device)

    return ([(s, BASE, BASE) for s in sizes] + [(rows(s, BASE), s, BASE) for s in sizes]
            + [(rows(BASE, s), BASE, s) for s in sizes])


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda l: f"{l[0]}-{l[1]}")
@pytest.mark.parametrize("device,algorithm,dtype", algorithm_dtype_params())
def test_sizes_and_layouts(device, algorithm, dtype, layout):
    """Each size packed, and on the GPU also with padded leading dimensions: packed, the sweep's
    odd sizes leave rows off 16-byte boundaries, so the rungs' 16-byte copy and TMA paths would
    meet the edge sizes only where the other dimensions are multiples of 8."""
    torch.manual_seed(0)
    packings = ["", "padded-"] if device == "cuda" else [""]
    checked = 0
    for m, n, k in sweep(device, algorithm, dtype):
        for packing in packings:
            a = random_matrix(m, k, dtype, device, packing + layout[0])
            b = random_matrix(k, n, dtype, device, packing + layout[1])
            checked += assert_matches_reference(a, b, algorithm)
    assert checked > 0, f"{algorithm} refused every size of the sweep"


@pytest.mark.parametrize("device,algorithm,dtype", algorithm_dtype_params())
def test_sliced_inputs_with_offset(device, algorithm, dtype):
    checked = 0
    for m, n, k in [(33, 65, 129), (128, 128, 128), (5, 300, 17)]:
        a = random_matrix(m, k, dtype, device, "sliced")
        b = random_matrix(k, n, dtype, device, "sliced")
        checked += assert_matches_reference(a, b, algorithm)
        checked += assert_matches_reference(a, b[:, ::2], algorithm)  # no unit stride at all
    assert checked > 0, f"{algorithm} refused every case"


def unusual_strides(m, n, k, dtype, device):
    """(name, a, b) with strides torch.mm takes but few kernels expect: 0 along one dimension
    (a row or a column expanded), or rows that overlap (8 elements apart, shorter than their
    length; 16 bytes apart in 16 bits, so the 16-byte copy and TMA paths may take them)."""
    def rand(*shape):
        return torch.randn(*shape, device=device).to(dtype)

    def overlapping(rows, cols):
        return rand(rows * 8 + cols).as_strided((rows, cols), (8, 1))

    plain_a, plain_b = rand(m, k), rand(k, n)
    return [("a-row-expanded", rand(1, k).expand(m, k), plain_b),
            ("a-column-expanded", rand(m, 1).expand(m, k), plain_b),
            ("b-row-expanded", plain_a, rand(1, n).expand(k, n)),
            ("b-column-expanded", plain_a, rand(k, 1).expand(k, n)),
            ("both-scalars-expanded", rand(()).expand(m, k), rand(()).expand(k, n)),
            ("a-rows-overlap", overlapping(m, k), plain_b),
            ("b-rows-overlap", plain_a, overlapping(k, n)),
            ("b-transposed-rows-overlap", plain_a, overlapping(n, k).t())]


@pytest.mark.parametrize("device,algorithm,dtype", algorithm_dtype_params())
def test_zero_and_overlapping_strides(device, algorithm, dtype):
    """Expanded and overlapping operands are read in place, as torch.mm reads them, or refused
    by an algorithm's `accepts` with its reason; never misread."""
    torch.manual_seed(0)
    checked = 0
    for m, n, k in [(61, 33, 37), (48, 256, 64), (128, 256, 64), (5, 33, 37)]:
        for name, a, b in unusual_strides(m, n, k, dtype, device):
            try:
                checked += assert_matches_reference(a, b, algorithm)
            except AssertionError as error:
                raise AssertionError(f"{name} at {m}x{n}x{k}: {error}") from error
    assert checked > 0, f"{algorithm} refused every case"


@pytest.mark.parametrize("device,algorithm,dtype", algorithm_dtype_params())
def test_larger_square(device, algorithm, dtype):
    """n x n x n off every tile, or as many rows as a rung made for a few tokens takes."""
    n = 517 if device == "cuda" else 259
    m = rows_accepted(algorithm, n, n, n, dtype, device)
    assert assert_matches_reference(random_matrix(m, n, dtype, device),
                                    random_matrix(n, n, dtype, device), algorithm), (
        f"{algorithm} refused {m} x {n} x {n}")


@pytest.mark.parametrize("device,algorithm", algorithm_params())
def test_empty_dimensions(device, algorithm):
    """Empty products are zeros of their shape, on every rung: the op asks the rung's `accepts`
    first, and every rung takes these (the only rules that refuse, the skinny rungs', read M
    alone, and take at least 16 rows)."""
    cases = [(0, 5, 3), (4, 0, 3), (4, 5, 0), (0, 0, 0)]
    checked = 0
    for m, n, k in cases:
        a, b = torch.randn(m, k, device=device), torch.randn(k, n, device=device)
        result = run_checked(a, b, algorithm)
        if result is None:
            continue
        checked += 1
        out, _ = result
        assert out.shape == (m, n)
        assert torch.equal(out, torch.zeros(m, n, device=device))
    assert checked == len(cases), f"{algorithm} refused {len(cases) - checked} empty products"


@pytest.mark.parametrize("device,algorithm,dtype", algorithm_dtype_params())
def test_sums_accumulate_in_float32(device, algorithm, dtype):
    """Sums of 3000 ones come out as 3000 rounded to the dtype once: a float32 sum is exact, where
    float16 sums stop at 2048 and bfloat16 ones at 256. The 16-bit tolerances of random products
    (relative errors of 1e-3 and 4e-3) need not tell a 16-bit accumulator apart; this does, on
    every rung and both layouts of b (rows 16-byte aligned, so the TMA rungs take them), 33 rows
    or as many as the rung takes."""
    n, k = 72, 3000
    m = rows_accepted(algorithm, 33, k, n, dtype, device)
    a = torch.ones(m, k, dtype=dtype, device=device)
    checked = 0
    for b in [torch.ones(k, n, dtype=dtype, device=device),
              torch.ones(n, k, dtype=dtype, device=device).t()]:
        result = run_checked(a, b, algorithm)
        if result is None:
            continue
        checked += 1
        out, _ = result
        assert torch.equal(out, torch.full((m, n), float(k), dtype=dtype, device=device)), (
            f"sums of {k} ones: {out.unique().tolist()}")
    assert checked > 0, f"{algorithm} refused both layouts of {m} x {k} x {n}"


@pytest.mark.parametrize("device,algorithm", algorithm_params())
def test_inputs_are_not_written(device, algorithm):
    m = rows_accepted(algorithm, 40, 30, 20, torch.float32, device)
    a, b = torch.randn(m, 30, device=device), torch.randn(30, 20, device=device)
    a_copy, b_copy = a.clone(), b.clone()
    assert run_checked(a, b, algorithm) is not None, f"{algorithm} refused {m} rows"
    assert torch.equal(a, a_copy) and torch.equal(b, b_copy)


@pytest.mark.parametrize("device,algorithm,dtype", algorithm_dtype_params())
def test_every_rung_takes_a_small_aligned_product(device, algorithm, dtype):
    """Every algorithm takes, in every dtype it lists, a [7, 64] @ [64, 16] product against a
    row-major b and an nn.Linear weight's w.t(), and computes it: by the rungs' `accepts` rules
    (csrc/cuda/*.cu), the only refusals are of rows (the skinny rungs take up to 64, 128 and 16),
    and 7 rows are within all of them; rows of 64 and 16 elements are 16-byte aligned in every
    dtype, so wgmma's and skinny_tma's TMA copies take the operands in place. A rung that refused
    such a product would pass the sweeps above on the few products it takes."""
    torch.manual_seed(0)
    a = random_matrix(7, 64, dtype, device)
    for layout in ["row", "col"]:
        b = random_matrix(64, 16, dtype, device, layout)
        assert mmv._C.algorithm_accepts(algorithm, a, b) == (True, ""), layout
        assert assert_matches_reference(a, b, algorithm), layout


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_auto(device, dtype):
    a, b = random_matrix(100, 80, dtype, device), random_matrix(80, 60, dtype, device, "col")
    assert mmv.auto_choice(a, b) in mmv.algorithms(device)
    assert_matches_reference(a, b, "auto")
    # The wrapper's default is the op's auto, and auto runs the algorithm it reports.
    assert torch.equal(mmv.matmul(a, b), torch.ops.mm_variants.matmul(a, b, "auto"))
    assert torch.equal(mmv.matmul(a, b), mmv.matmul(a, b, mmv.auto_choice(a, b)))


@pytest.mark.parametrize("isa", ["avx512", "avx2", "generic"])
@pytest.mark.parametrize("algorithm", ["simd_packed", "parallel"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_cpu_simd_fallbacks(isa, algorithm, dtype):
    best = mmv._C.cpu_isa()
    order = ["generic", "avx2", "avx512"]
    if order.index(isa) > order.index(best):
        pytest.skip(f"this CPU does not support {isa}")
    try:
        mmv._C.set_cpu_isa(isa)
        assert mmv._C.cpu_isa() == isa
        for m, n, k in [(1, 1, 1), (15, 33, 257), (170, 260, 300)]:
            assert_matches_reference(random_matrix(m, k, dtype, "cpu", "col"),
                                     random_matrix(k, n, dtype, "cpu"), algorithm)
            assert mmv._C.cpu_last_micro_kernel() == isa  # the fallback ran, not only was set
    finally:
        mmv._C.set_cpu_isa(best)


@pytest.mark.parametrize("device,algorithm,dtype", algorithm_dtype_params(with_auto=True))
def test_infinities_and_nans_propagate(device, algorithm, dtype):
    """Infinite and NaN elements reach the output as in IEEE arithmetic, as the float64 product
    rounded to the dtype has them (an infinity with each product's sign, NaN from NaN and from
    inf - inf, products past the dtype's largest value infinite), through every kernel:
    3xTF32's operand split included, which cannot give inf * inf, nor inf times a float32 too
    small for tf32, nor two values near float32's largest, as float32 does. The finite elements
    stay within the tolerance."""
    torch.manual_seed(0)
    inf, nan = float("inf"), float("nan")
    big = torch.finfo(dtype).max * 0.9  # its square overflows
    for m in (8, 200):  # within the skinny rungs' rows, and past them
        a = torch.randn(m, 256, device=device).to(dtype)
        b = torch.randn(256, 72, device=device).to(dtype)
        a[1, 3], a[2, 5], a[3, 7], b[10, 20] = inf, -inf, nan, inf
        a[4, 10], a[5, 10] = inf, -inf  # inf * inf and -inf * inf at (4, 20) and (5, 20)
        a[:, 30], b[30, :] = 0, 0
        a[6, 30], b[30, 40] = big, big  # big * big alone at (6, 40)
        if dtype == torch.float32 and not (device == "cuda" and
                                           torch.backends.cuda.matmul.allow_tf32):
            b[10, 50] = 1e-44  # subnormal, 0 in tf32: +-inf at (4, 50) and (5, 50)
        for b_view in (b, b.t().contiguous().t()):
            result = run_checked(a, b_view, algorithm)
            if result is None:
                continue
            out, ref = result[0].cpu().double(), a.cpu().double() @ b.cpu().double()
            rounded = ref.to(dtype).double()
            assert torch.equal(out.isnan(), rounded.isnan()), "NaN where float64 has none, or not"
            infinite = rounded.isinf()
            assert torch.equal(out.isinf(), infinite), "infinite where float64 is not, or not"
            assert torch.equal(out[infinite], rounded[infinite]), "an infinity of the wrong sign"
            finite = rounded.isfinite()
            assert relative_error(out[finite], ref[finite]) <= result[1]
