"""Random products for every algorithm and dtype: shapes drawn across the regimes the kernels and
wgmma's planner tell apart (a few tokens to thousands of rows, K from 1 to 16384, sizes on and
just off tile multiples, now and then an empty dimension), random layouts and storage offsets,
2-D, batched and nn.Linear calls. Each result is checked against float64 with the outputs
poisoned; a failure names its case, and the test's id seeds the draw, so it replays as it failed.
MM_VARIANTS_FUZZ_SEED=<any text> draws other cases (the failure names the seed to replay it)."""
from __future__ import annotations

import dataclasses
import math
import os
import random
import zlib

import pytest
import torch

import torch_mm_variants as mmv
from conftest import algorithm_dtype_params, assert_result, random_matrix, run_accepted
from test_bmm import batch_operand
from test_linear import ACTIVATIONS, reference as linear_reference

CASES = 64
# Multiply-adds per case: milliseconds on the slowest rung (naive) of either device.
BUDGET = {"cpu": 1 << 23, "cuda": 1 << 33}
LONGEST = {"cpu": 4096, "cuda": 16384}     # the longest M, N or K drawn
MAX_OUTPUT = 1 << 26                       # elements: the float64 reference stays under 512 MB
TILES = [8, 16, 64, 80, 96, 128, 160, 192, 256, 320]
LAYOUTS = ["row", "col", "padded-row", "padded-col", "sliced", "offset"]


@dataclasses.dataclass
class Case:
    call: str              # "matmul", "batch" (per-entry b), "shared" (batch, one b) or "linear"
    batch: int             # linear's x is [m, k] for 1, else [batch, m, k]
    m: int
    n: int
    k: int
    a_layout: str
    b_layout: str
    activation: str = "none"
    bias: bool = False


def log_uniform(rng: random.Random, longest: int) -> int:
    return int(round(math.exp(rng.uniform(0, math.log(longest)))))


def random_dim(rng: random.Random, longest: int) -> int:
    """Half the time any size, log-uniform; half the time a multiple of a tile shape, or one
    off it either way."""
    size = log_uniform(rng, longest)
    if rng.random() < 0.5:
        tile = rng.choice(TILES)
        size = tile * max(1, round(size / tile)) + rng.choice([-1, 0, 0, 1])
    return min(max(size, 1), longest)


def random_case(rng: random.Random, device: str) -> Case:
    """A case within the device's budget: a third of them at decode's few rows (M <= 64)."""
    while True:
        call = rng.choice(["matmul", "matmul", "batch", "shared", "linear"])
        batch = rng.randint(1, 3) if call != "matmul" else 1
        m = log_uniform(rng, 64) if rng.random() < 1 / 3 else random_dim(rng, LONGEST[device])
        n, k = random_dim(rng, LONGEST[device]), random_dim(rng, LONGEST[device])
        if rng.random() < 0.03:
            m, n, k = rng.choice([(0, n, k), (m, 0, k), (m, n, 0)])
        if batch * m * n * k <= BUDGET[device] and batch * m * n <= MAX_OUTPUT:
            return Case(call, batch, m, n, k, rng.choice(LAYOUTS), rng.choice(LAYOUTS),
                        rng.choice(ACTIVATIONS), rng.random() < 0.5)


def batch_of(case: Case, rows, cols, dtype, device, layout):
    """test_bmm's batch operand [batch, rows, cols] for a 2-D layout: its entries transposed for
    "col" and "padded-col", one element into the storage for "offset", row-major otherwise."""
    entries = "offset" if layout == "offset" else "col" if "col" in layout else "row"
    return batch_operand(case.batch, rows, cols, dtype, device, entries)


def run_case(case: Case, algorithm: str, dtype, device: str):
    """(the op's result and tolerance, or None where the algorithm refuses, with the reason
    checked; the float64 reference; the norm its errors are relative to). An activation's
    errors are relative to the product's norm: gelu, silu and relu grow the product's errors by
    at most 1.13 times, but may leave a far smaller output (from a row of large negative values)."""
    if case.call == "linear":
        x = (random_matrix(case.m, case.k, dtype, device, case.a_layout) if case.batch == 1
             else batch_of(case, case.m, case.k, dtype, device, case.a_layout))
        weight = random_matrix(case.k, case.n, dtype, device, case.b_layout).t()
        bias = torch.randn(case.n, device=device).to(dtype) if case.bias else None
        rows = x.reshape(case.batch * case.m, case.k)
        result = run_accepted(algorithm, rows, weight.t(), lambda: mmv.linear(
            x, weight, bias, case.activation, algorithm))
        product = linear_reference(x, weight, bias, "none")
        return (result, linear_reference(x, weight, bias, case.activation),
                product.norm().item())
    if case.call == "matmul":
        a = random_matrix(case.m, case.k, dtype, device, case.a_layout)
        b = random_matrix(case.k, case.n, dtype, device, case.b_layout)
        first_b = b
    else:
        a = batch_of(case, case.m, case.k, dtype, device, case.a_layout)
        if case.call == "shared":
            b = first_b = random_matrix(case.k, case.n, dtype, device, case.b_layout)
        else:
            b = batch_of(case, case.k, case.n, dtype, device, case.b_layout)
            first_b = b[0]
    a_rows = a if a.dim() == 2 else a[0]
    result = run_accepted(algorithm, a_rows, first_b, lambda: mmv.matmul(a, b, algorithm))
    return result, a.double() @ b.double(), None


@pytest.mark.parametrize("device,algorithm,dtype", algorithm_dtype_params(with_auto=True))
def test_random_products(device, algorithm, dtype, request):
    seed = os.environ.get("MM_VARIANTS_FUZZ_SEED", "")
    rng = random.Random(zlib.crc32((request.node.callspec.id + seed).encode()))
    torch.manual_seed(rng.getrandbits(32))
    checked = 0
    for _ in range(CASES):
        case = random_case(rng, device)
        result, ref, scale = run_case(case, algorithm, dtype, device)
        if result is None:
            continue
        try:
            assert_result(result[0], ref, dtype, ref.device, result[1], scale)
        except AssertionError as error:
            replay = f" (MM_VARIANTS_FUZZ_SEED={seed})" if seed else ""
            raise AssertionError(f"{case}{replay}: {error}") from None
        checked += 1
    assert checked > 0, f"{algorithm} refused all {CASES} random cases"
