"""CUDA-specific behaviour of every CUDA algorithm (the correctness sweep over sizes and layouts is
test_matmul.py): storage offsets that break 16-byte alignment, work on a side stream, CUDA graph
capture and replay, inputs on a device that is not the current one, and operands and outputs of
more than 2^31 elements (64-bit index math). The algorithms come from the registry, so every rung is
covered, later ones included."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import torch_mm_variants as mmv
from conftest import (DTYPE_BY_C10_NAME, capture_graph, child_env, dtype_params, gpu_available,
                      on_side_stream, relative_error, rows_accepted, run_accepted, tolerance_for)

pytestmark = pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU and a CUDA build")


def cuda_algorithm_dtypes(device: str = "cuda") -> list:
    """(algorithm, dtype) for the device's algorithms, as dtype_params gives them."""
    if not gpu_available():
        return []
    params = dtype_params([(device, name) for name in mmv.algorithms(device)])
    return [pytest.param(*p.values[1:], id=p.id.removeprefix(f"{device}-"), marks=p.marks)
            for p in params]


def cuda_algorithms() -> list[str]:
    return mmv.algorithms("cuda") if gpu_available() else []


def a_dtype_of(algorithm: str, device: str = "cuda") -> torch.dtype:
    """float32 where the algorithm takes it, else the first dtype it lists (16-bit-only rungs)."""
    dtypes = [DTYPE_BY_C10_NAME[t] for t in mmv._C.algorithm_dtypes(device, algorithm)]
    return torch.float32 if torch.float32 in dtypes else dtypes[0]


def if_accepted(algorithm: str, a: torch.Tensor, b: torch.Tensor, run):
    """run()'s result, or None where `algorithm` refuses the product a @ b (one entry's, for a
    batch) by design, as algorithm_accepts says (a rung made for few rows of a, say), after
    checking that run() refuses it with that reason (run_accepted). Where it accepts, run() must
    succeed: a failure is not taken for a refusal."""
    result = run_accepted(algorithm, a, b, run)
    return None if result is None else result[0]


def matmul_if_accepted(a: torch.Tensor, b: torch.Tensor, algorithm: str):
    entry = a[0] if a.dim() == 3 else a
    return if_accepted(algorithm, entry, b, lambda: mmv.matmul(a, b, algorithm))


def check(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, tolerance: float) -> None:
    ref = a.double() @ b.double()
    assert out.shape == ref.shape and out.dtype == a.dtype and out.device == a.device
    err = relative_error(out, ref)
    assert err <= tolerance, f"relative error {err:.3e} > {tolerance:.0e}"


def offset_matrix(rows: int, cols: int, dtype, offset: int, transposed: bool) -> torch.Tensor:
    """A [rows, cols] view starting `offset` elements into its storage, row-major or a transposed
    (column-major) view."""
    flat = torch.randn(rows * cols + offset, device="cuda").to(dtype)[offset:]
    return flat.view(cols, rows).t() if transposed else flat.view(rows, cols)


@pytest.mark.parametrize("algorithm,dtype", cuda_algorithm_dtypes())
def test_misaligned_storage_offset(algorithm, dtype):
    """Data pointers off 16-byte alignment take the scalar-load path, never a misaligned fault."""
    torch.manual_seed(0)
    tolerance = tolerance_for(dtype, "cuda")
    ran = 0
    for m, n, k in [(45, 67, 33), (130, 129, 264), (5, 67, 33)]:
        for offset in (1, 2, 3):
            for a_t, b_t in [(False, False), (False, True), (True, False), (True, True)]:
                a = offset_matrix(m, k, dtype, offset, a_t)
                b = offset_matrix(k, n, dtype, offset % 3 + 1, b_t)
                assert a.data_ptr() % 16 != 0 and b.data_ptr() % 16 != 0
                out = matmul_if_accepted(a, b, algorithm)
                if out is not None:
                    check(out, a, b, tolerance)
                    ran += 1
    assert ran > 0, f"{algorithm} refused every shape"


@pytest.mark.parametrize("algorithm", cuda_algorithms())
def test_side_stream(algorithm):
    """The kernel runs on the current stream: here a side stream held back by a sleep, behind a
    copy into `a` that it must see."""
    torch.manual_seed(0)
    dtype = a_dtype_of(algorithm)
    tolerance = tolerance_for(dtype, "cuda")
    rows = rows_accepted(algorithm, 48, 200, 300, dtype, "cuda")
    a = torch.randn(rows, 200, device="cuda").to(dtype)
    b = torch.randn(200, 300, device="cuda").to(dtype)
    new_a = torch.randn_like(a)

    def held_back_matmul():
        torch.cuda._sleep(50_000_000)  # tens of milliseconds
        a.copy_(new_a)
        return mmv.matmul(a, b, algorithm)

    check(on_side_stream(held_back_matmul), new_a, b, tolerance)


# Eight threads, each on its own stream, make the first calls of every CUDA algorithm (and auto)
# of a fresh process at once, in each dtype it takes: the per-kernel and per-device setup done on
# a first call (shared-memory attributes, device properties, occupancy, the TMA encoder) is raced.
CONCURRENT_FIRST_CALLS = """
import sys, threading, torch, torch_mm_variants as mmv
sys.path.insert(0, sys.argv[1])
from conftest import DTYPE_BY_C10_NAME, TOLERANCE
mmv._C.set_poison_outputs(True)  # every output starts as NaN: an unwritten element shows
tolerance = TOLERANCE  # TF32 off: float32 in 3xTF32 on the tensor-core rungs
work = [("auto", t) for t in (torch.float32, torch.bfloat16)] + [
    (name, DTYPE_BY_C10_NAME[t]) for name in mmv.algorithms("cuda")
    for t in mmv._C.algorithm_dtypes("cuda", name)]
problems, ran = [], []
start = threading.Barrier(8)

def worker(seed):
    stream = torch.cuda.Stream()
    torch.manual_seed(seed)
    start.wait()
    with torch.cuda.stream(stream):
        for algorithm, dtype in work:
            for m, n, k in ((8, 512, 512), (300, 257, 129)):
                a = torch.randn(m, k, device="cuda").to(dtype)
                b = torch.randn(n, k, device="cuda").to(dtype).t()
                try:
                    out = mmv.matmul(a, b, algorithm)
                except RuntimeError as error:
                    if "cannot take these inputs" in str(error):
                        continue
                    problems.append(f"{algorithm} {dtype} {m}x{n}x{k}: {error}")
                    continue
                ref = a.double() @ b.double()
                err = ((out.double() - ref).norm() / ref.norm()).item()
                if not err <= tolerance[dtype]:
                    problems.append(f"{algorithm} {dtype} {m}x{n}x{k}: relative error {err:.2e}")
                ran.append(algorithm)
    stream.synchronize()

threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(8)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
assert not problems, "\\n".join(problems)
assert set(ran) == {name for name, _ in work}, sorted({name for name, _ in work} - set(ran))
print(len(ran))
"""


def test_concurrent_first_calls_from_threads():
    tests = os.path.dirname(os.path.abspath(__file__))
    child = subprocess.run([sys.executable, "-c", CONCURRENT_FIRST_CALLS, tests], env=child_env(),
                           capture_output=True, text=True, timeout=600)
    assert child.returncode == 0, child.stderr[-3000:]
    assert int(child.stdout.split()[-1]) > 0


@pytest.mark.parametrize("algorithm,dtype", cuda_algorithm_dtypes())
def test_cuda_graph_capture_and_replay(algorithm, dtype):
    """Capture the op, change its inputs in place, replay: the output follows the new inputs."""
    torch.manual_seed(0)
    tolerance = tolerance_for(dtype, "cuda")
    rows = rows_accepted(algorithm, 60, 67, 300, dtype, "cuda")
    a = torch.randn(rows, 67, device="cuda").to(dtype)
    b = torch.randn(67, 300, device="cuda").to(dtype).t().contiguous().t()  # column-major
    # Warm-up outside the capture (module load, opt-ins); the rung takes these rows.
    warm_up = on_side_stream(lambda: matmul_if_accepted(a, b, algorithm))
    assert warm_up is not None, f"{algorithm} refused {rows} rows"
    graph, out = capture_graph(lambda: mmv.matmul(a, b, algorithm))
    for _ in range(2):
        a.copy_(torch.randn_like(a, dtype=torch.float32))
        b.copy_(torch.randn_like(b, dtype=torch.float32))
        graph.replay()
        torch.cuda.synchronize()
        check(out, a, b, tolerance)


def two_gpus() -> bool:
    return gpu_available() and torch.cuda.device_count() >= 2


@pytest.mark.skipif(not two_gpus(), reason="needs 2 GPUs")
@pytest.mark.parametrize("algorithm,dtype",
                         cuda_algorithm_dtypes("cuda:1") if two_gpus() else [])
def test_inputs_on_another_device(algorithm, dtype):
    """Inputs on cuda:1 while cuda:0 is current: each op runs on cuda:1 (its stream, its TMA
    descriptors and launch limits), and cuda:0 stays current. Unaligned rows (the copy paths)
    and 16-byte-aligned ones (TMA), matmul, linear with a bias (the fused epilogue), a batch
    (bmm), their gradients, and a CUDA graph captured on cuda:1."""
    torch.manual_seed(0)
    device = "cuda:1"
    tolerance = tolerance_for(dtype, device)
    with torch.cuda.device(0):
        ran = 0
        for m, n, k in [(48, 90, 150), (64, 256, 512), (256, 512, 256), (4, 90, 150)]:
            a = torch.randn(m, k, device=device).to(dtype)
            w = torch.randn(n, k, device=device).to(dtype)
            if matmul_if_accepted(a, w.t(), algorithm) is None:
                continue
            ran += 1
            check(mmv.matmul(a, w.t(), algorithm), a, w.t(), tolerance)
            bias = torch.randn(n, device=device).to(dtype)
            out = mmv.linear(a, w, bias, algorithm=algorithm)
            ref = a.double() @ w.double().t() + bias.double()
            assert relative_error(out, ref) <= tolerance
            batch = torch.randn(3, m, k, device=device).to(dtype)
            out = mmv.matmul(batch, w.t(), algorithm)
            assert relative_error(out, batch.double() @ w.double().t()) <= tolerance
            leaves = [a.clone().requires_grad_(), w.clone().requires_grad_()]
            mmv.linear(*leaves, algorithm=algorithm).sum().backward()
            ones = torch.ones(m, n, device=device, dtype=torch.float64)
            assert relative_error(leaves[0].grad, ones @ w.double()) <= tolerance
            assert relative_error(leaves[1].grad, ones.t() @ a.double()) <= tolerance
            # A graph is captured and replayed on streams of its device, cuda:1 current for both
            # (replayed on cuda:0's stream, it would not be ordered after the copy).
            with torch.cuda.device(1):
                graph, captured = capture_graph(lambda: mmv.matmul(a, w.t(), algorithm),
                                                torch.cuda.Stream(device))
                a.copy_(torch.randn_like(a, dtype=torch.float32))
                graph.replay()
                torch.cuda.synchronize()
            check(captured, a, w.t(), tolerance)
            assert torch.cuda.current_device() == 0
        assert ran > 0, f"{algorithm} refused every shape"


def skip_unless_free(needed_bytes: int) -> None:
    """Skips a test whose tensors would not fit the GPU's free memory (its test lock keeps the
    other tests of several GB away, so this depends on the GPU alone)."""
    free, _ = torch.cuda.mem_get_info()
    if free < needed_bytes:
        pytest.skip(f"needs {needed_bytes / 2 ** 30:.1f} GB of free GPU memory, "
                    f"{free / 2 ** 30:.1f} GB free")


LARGE = 2 ** 23 + 64  # with SMALL_K = 256, an operand of just over 2^31 elements (4.3-8.6 GB)
SMALL_K = 256
# float32 both ways: in 3xTF32 (TF32 off) and in TF32, which the tensor-core rung tiles differently.
LARGE_DTYPES = [torch.bfloat16, torch.float32,
                pytest.param(torch.float32, marks=pytest.mark.tf32, id="float32-tf32")]


@pytest.mark.usefixtures("one_large_test_at_a_time")
@pytest.mark.parametrize("dtype", LARGE_DTYPES)
@pytest.mark.parametrize("operand", ["a-row", "a-col", "b-row", "b-col"])
def test_operand_past_2_31_elements(operand, dtype):
    """One operand of LARGE x 256 (or 256 x LARGE) elements in each layout, so that row * ld or
    k * ld passes 2^31: 32-bit index math would read the wrong rows. The rows past the 2^31st
    element are checked against float64."""
    skip_unless_free(2 * LARGE * SMALL_K * dtype.itemsize)
    torch.manual_seed(0)
    big = torch.randn(LARGE * SMALL_K, device="cuda", dtype=dtype)
    small = torch.randn(8 * SMALL_K, device="cuda", dtype=dtype)
    row_major = operand.endswith("row")
    if operand.startswith("a"):  # [LARGE, K] @ [K, 8]
        a = big.view(LARGE, SMALL_K) if row_major else big.view(SMALL_K, LARGE).t()
        b = small.view(SMALL_K, 8)
    else:  # [8, K] @ [K, LARGE]
        a = small.view(8, SMALL_K)
        b = big.view(SMALL_K, LARGE) if row_major else big.view(LARGE, SMALL_K).t()
    # The last 256 rows or columns of the large dimension lie past element 2^31.
    tail = slice(LARGE - 256, LARGE)
    rungs_run = 0
    for algorithm in ["auto", *algorithms_taking(dtype)]:
        tolerance = tolerance_for(dtype, "cuda")
        out = matmul_if_accepted(a, b, algorithm)
        if out is None:
            continue
        rungs_run += algorithm != "auto"
        if operand.startswith("a"):
            check(out[tail], a[tail], b, tolerance)
        else:
            check(out[:, tail], a, b[:, tail], tolerance)
        del out
    assert rungs_run > 0, "every rung refused the product"


def algorithms_taking(dtype: torch.dtype) -> list[str]:
    return [name for name in cuda_algorithms() if dtype in
            [DTYPE_BY_C10_NAME[t] for t in mmv._C.algorithm_dtypes("cuda", name)]]


# An output of 65539 x 32773 = 2,147,942,415 elements: its last rows lie past element 2^31.
BIG_M, BIG_N, BIG_K = 2 ** 16 + 3, 2 ** 15 + 5, 40


def check_corners(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, tolerance: float,
                  bias=None) -> None:
    """Every element written (the output was poisoned with NaN), and the four corner blocks of
    64 x 64, the last of them past element 2^31, within `tolerance` of float64."""
    assert not torch.isnan(out).any().item(), "unwritten (NaN-poisoned) or NaN elements"
    first, last = slice(0, 64), slice(-64, None)
    for rows in (first, last):
        for cols in (first, last):
            ref = a[rows].double() @ b[:, cols].double()
            if bias is not None:
                ref += bias[cols].double()
            err = relative_error(out[rows, cols], ref)
            assert err <= tolerance, f"relative error {err:.3e} > {tolerance:.0e}"


@pytest.mark.usefixtures("one_large_test_at_a_time")
@pytest.mark.parametrize("dtype", LARGE_DTYPES)
@pytest.mark.parametrize("op", ["matmul", "linear", "bmm"])
def test_output_past_2_31_elements(op, dtype):
    """An output of more than 2^31 elements, from matmul, from linear (whose bias some kernels
    add in their store) and from the last entry of a bmm batch (which some kernels take in one
    launch): every store past element 2^31 must land where it belongs."""
    skip_unless_free(BIG_M * BIG_N * (dtype.itemsize + 1) + 2 ** 30)  # the output and its NaN mask
    torch.manual_seed(0)
    a = torch.randn(BIG_M, BIG_K, device="cuda", dtype=dtype)
    w = torch.randn(BIG_N, BIG_K, device="cuda", dtype=dtype)
    bias = torch.randn(BIG_N, device="cuda", dtype=dtype) if op == "linear" else None
    batch = torch.stack([torch.randn_like(a[:2 ** 15]), a[:2 ** 15]]) if op == "bmm" else None
    rungs_run = 0
    for algorithm in ["auto", *algorithms_taking(dtype)]:
        tolerance = tolerance_for(dtype, "cuda")
        if op == "bmm":  # 2 x 32768 x 32773: its second entry ends past element 2^31
            out = matmul_if_accepted(batch, w.t(), algorithm)
            entry = None if out is None else out[1]
            a_entry = batch[1]
        else:
            out = entry = if_accepted(algorithm, a, w.t(),
                                      lambda: mmv.linear(a, w, bias, algorithm=algorithm)
                                      if op == "linear" else mmv.matmul(a, w.t(), algorithm))
            a_entry = a
        if entry is not None:
            rungs_run += algorithm != "auto"
            check_corners(entry, a_entry, w.t(), tolerance, bias)
        out = entry = None
        torch.cuda.empty_cache()
    assert rungs_run > 0, "every rung refused the product"


# K within one k tile (8 or 32) of 2^31: a k loop that steps k0 by the tile while k0 < K would
# wrap k0 past 2^31 to a negative index, still below K. One block then walks all of K, which
# takes minutes on the textbook rungs (an H200: tiled 106 s, tiled_register 183 s, block_tiled
# 319 s, block_tiled_vectorized 338 s, warp_tiling 490 s; naive and coalescing 46 s; the others
# seconds), so these tests run only where MM_VARIANTS_LONG_TESTS=1 asks for them.
K_NEAR_INT_MAX = 2 ** 31 - 7
LONG_TESTS = os.environ.get("MM_VARIANTS_LONG_TESTS") == "1"


@pytest.mark.skipif(not LONG_TESTS, reason="minutes an algorithm: MM_VARIANTS_LONG_TESTS=1")
@pytest.mark.usefixtures("one_large_test_at_a_time")
@pytest.mark.parametrize("algorithm", ["auto", *algorithms_taking(torch.bfloat16)])
def test_k_within_a_tile_of_int_max(algorithm):
    """[1, K] @ [K, 1] in bf16 at K = 2^31 - 7 (8 GiB of operands) must equal the exact sum.
    The entries are integers in [-3, 3], so every partial sum, in any order and in any float32
    accumulator (tensor cores truncate theirs: random normals came out up to 16% off), is an
    integer far below 2^24 and exact: one k tile lost, repeated or read from elsewhere shows."""
    chunk = 2 ** 28
    skip_unless_free(2 * K_NEAR_INT_MAX * 2 + 3 * chunk * 8)
    torch.manual_seed(0)
    a = torch.randint(-3, 4, (1, K_NEAR_INT_MAX), device="cuda", dtype=torch.bfloat16)
    b = torch.randint(-3, 4, (K_NEAR_INT_MAX, 1), device="cuda", dtype=torch.bfloat16)
    out = matmul_if_accepted(a, b, algorithm)
    assert out is not None, f"{algorithm} refused one row"  # every rung takes 16 or more
    exact = sum((a[0, i:i + chunk].double() @ b[i:i + chunk, 0].double()).item()
                for i in range(0, K_NEAR_INT_MAX, chunk))
    expected = torch.tensor(exact, dtype=torch.bfloat16).item()  # the sum rounded to bf16
    assert out.item() == expected, f"{out.item()} against {exact} (bf16 {expected})"


@pytest.mark.usefixtures("one_large_test_at_a_time")
@pytest.mark.parametrize("algorithm", ["auto", *algorithms_taking(torch.bfloat16)])
def test_columns_up_to_int_max(algorithm):
    """N = 2^31 - 4 (a [2, 1] by [1, N] bf16 product, a 4 GiB b and an 8 GiB output): the last
    column tile's threads past N must store nothing, where n + 4 wrapped past 2^31 and a 4-wide
    store landed on the next row's first columns (rungs 6 and 7). The first and last columns of
    both rows are checked against float64."""
    n = 2 ** 31 - 4
    skip_unless_free(n * 2 * 3 + 2 ** 30)
    torch.manual_seed(0)
    a = torch.randn(2, 1, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(1, n, device="cuda", dtype=torch.bfloat16)
    out = matmul_if_accepted(a, b, algorithm)
    assert out is not None, f"{algorithm} refused two rows"  # every rung takes 16 or more
    tolerance = tolerance_for(torch.bfloat16, "cuda")
    for cols in (slice(0, 64), slice(n - 64, n)):
        check(out[:, cols], a, b[:, cols], tolerance)


@pytest.mark.usefixtures("one_large_test_at_a_time")
def test_bmm_shared_b_past_2_31_rows():
    """A contiguous [65536, 32768, 1] bf16 batch against a shared [1, 1] b: its entries' rows,
    2^31 of them, are more than one product may have on the GPU, so the batch runs as a batch
    instead of as one product the kernels refuse. The first and last entries against float64."""
    batch, m = 2 ** 16, 2 ** 15
    skip_unless_free(batch * m * 2 * 2 + 2 ** 30)
    torch.manual_seed(0)
    a = torch.randn(batch, m, 1, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(1, 1, device="cuda", dtype=torch.bfloat16)
    out = mmv.matmul(a, b)
    tolerance = tolerance_for(torch.bfloat16, "cuda")
    for entry in (0, batch - 1):
        check(out[entry], a[entry], b, tolerance)
