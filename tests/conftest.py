"""Shared test helpers: the devices and algorithms to cover (from the registry), a float64
reference, tolerances, and output poisoning."""
from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import tempfile

import pytest
import torch

import torch_mm_variants as mmv
from torch_mm_variants import bench

DTYPE_BY_C10_NAME = {"Float": torch.float32, "Half": torch.float16, "BFloat16": torch.bfloat16,
                     "Double": torch.float64}
# Worst-case ||out - ref|| / ||ref|| against a float64 product of the same (rounded) inputs, tight
# enough that a kernel that loses bits shows: one rounding of the output to the dtype costs up to
# its unit roundoff (fp16 4.9e-4, bf16 3.9e-3) on outputs of a few elements, and measured up to
# 2.1e-4 and 1.7e-3 on the CPU's larger ones; TF32 up to 8e-4 (wgmma, whose tensor cores truncate
# its operands).
TOLERANCE = {torch.float64: 1e-12, torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 4e-3}
TF32_TOLERANCE = 2e-3
# The per-element bound (element_bound): the output's rounding (twice the unit roundoff; float64
# within 1e-12, as its relative tolerance), and each product's accumulation step (8 unit
# roundoffs of the accumulator: float32, or float64 for float64 inputs).
OUTPUT_ROUNDING = {torch.float64: 1e-12, torch.float32: 2.0 ** -23, torch.float16: 2.0 ** -10,
                   torch.bfloat16: 2.0 ** -7}
ACCUMULATION_STEP = {torch.float64: 2.0 ** -50, torch.float32: 2.0 ** -21,
                     torch.float16: 2.0 ** -21, torch.bfloat16: 2.0 ** -21}
# What a tensor core's float32 inputs lose on each product: TF32 keeps 10 of their 23 mantissa
# bits (rounded, or truncated by wgmma: up to 2^-10 each); 3xTF32 drops the product of the small
# parts (2^-22) and the tensor core truncates those parts to TF32 (2^-21 each).
TF32_INPUT_ROUNDING = 2.0 ** -8
SPLIT_TF32_INPUT_ROUNDING = 2.0 ** -19


def child_env(**variables) -> dict:
    """This environment, with these variables, in which a child process imports this package."""
    package_root = os.path.dirname(os.path.dirname(mmv.__file__))
    path = os.pathsep.join(p for p in [package_root, os.environ.get("PYTHONPATH")] if p)
    return {**os.environ, "PYTHONPATH": path, **variables}


def gpu_available() -> bool:
    return mmv.has_cuda() and torch.cuda.is_available()


def gpu_capability() -> tuple[int, int]:
    """The current GPU's compute capability, or (0, 0) without one."""
    return torch.cuda.get_device_capability() if gpu_available() else (0, 0)


def sm90a_available() -> bool:
    """Whether the GPU runs sm_90a code (exactly 9.0) and the build compiled it: where the Hopper
    rungs must be listed. Asked of the build, not of the registry, so that a rung missing from
    the listing fails its tests instead of skipping them."""
    return gpu_capability() == (9, 0) and mmv._C.has_sm90a()


def sm_count() -> int:
    """The SMs of the current GPU, which the skinny rungs' rules count."""
    return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count


def gemv_short_k(m: int, rows: int, k: int, dtype: torch.dtype) -> bool:
    """Where skinny_gemv runs a K-contiguous product of m tokens over `rows` weight rows (N, times
    a batch's entries) in its short-K kernel: rows of at most 32 16-byte vectors, m <= 4 (or 8 on
    rows of at most 64 elements), and at least 48 rows per SM. `auto` then takes skinny_gemv for
    float32 (16-bit rows go to skinny's short-rows kernel)."""
    tokens_fit = m <= 4 or (m <= 8 and k <= 64)
    return -(-k // (16 // dtype.itemsize)) <= 32 and tokens_fit and rows >= 48 * sm_count()


def gemv_takes(m: int, n: int, k: int, dtype: torch.dtype, row_major: bool = False,
               tma_reads_it: bool = False, entries: int = 1) -> bool:
    """Where `auto` takes skinny_gemv (a GPU that lists it) for `entries` products (a batch;
    tma_reads_it: skinny_tma, on sm_90a, reads the weight in place, 16-byte aligned rows).
    float32: up to 2 tokens; up to 4 on nn.Linear weights; on row-major weights that skinny_tma
    reads in place, up to 8 where they have up to 4096 columns; on row-major weights it does not
    read (which the rungs below copy or load element by element), up to 16. 16 bits: nn.Linear
    weights of 4 to 16 rows per SM and K >= 1024, at 1-2 tokens; float32 also on nn.Linear
    weights its short-K kernel takes (gemv_short_k), but for batches past 4 tokens that
    skinny_tma reads. A batch counts its entries' rows together (n x entries) for the short-K
    kernel and in 16 bits. Other products stay on the rungs below."""
    rows = n * entries
    if dtype != torch.float32:
        sms = sm_count()
        return not row_major and m <= 2 and k >= 1024 and 4 * sms <= rows <= 16 * sms
    if not row_major and entries > 1 and m > 4 and tma_reads_it:
        return False  # skinny_tma's batched kernel
    if not row_major and gemv_short_k(m, rows, k, dtype):
        return True
    if m > 16:
        return False
    if row_major and not tma_reads_it:
        return True
    if m > 8:
        return False
    if m <= 2:
        return True
    return n <= 4096 if row_major else m <= 4


def tma_batch_takes(m: int, n: int, k: int, dtype: torch.dtype, row_major: bool) -> bool:
    """Where `auto` runs a bmm batch of decode products (up to 64 tokens, TMA-aligned entries,
    on a GPU that lists skinny_tma) on skinny_tma's batched kernel rather than skinny's, where
    skinny_gemv does not take it (gemv_takes): float32 always; 16 bits on row-major entries of
    k >= 512 (p @ v), on K-contiguous ones of k >= 1024 and n >= 256 or of k > 256 and
    n >= 1024, on K-contiguous ones of 64 <= k <= 256 and n >= 256 (q @ k^T) past 16 tokens
    (k <= 64), past 8 (k <= 128) or at every count (k > 128), and past 8 tokens on matrices of
    16 MB or more."""
    if dtype == torch.float32:
        return True
    if row_major:
        return k >= 512
    if 64 <= k <= 256 and n >= 256 and m > (16 if k <= 64 else 8 if k <= 128 else 0):
        return True
    if (k >= 1024 and n >= 256) or (k > 256 and n >= 1024):
        return True
    return m > 8 and n * k * dtype.itemsize >= 16 << 20


def skinny_short_rows(m: int, rows: int, k: int) -> bool:
    """Where skinny runs 16-bit K-contiguous rows (16-byte aligned) of m tokens over `rows` weight
    rows (N, times a batch's entries) in its short-rows kernel: k <= 256 at 1-8 tokens, or up to
    64 where skinny_kernel's blocks do not all fit on the GPU at once (more than 32 rows per SM).
    `auto` then takes skinny over skinny_tma where chunks of 32 k times token tiles of 8
    (short_rows_fragments) are at most 8, or k <= 64."""
    if k > 256:
        return False
    if m <= 8:
        return True
    return m <= 64 and not rung10_blocks_fit_at_once(rows)


def rung10_blocks_fit_at_once(rows: int) -> bool:
    """Whether skinny_kernel's blocks of 16 rows over `rows` weight rows all fit on the GPU at
    once, two per SM: at most 32 rows per SM."""
    return rows <= 32 * sm_count()


def short_rows_fragments(m: int, k: int) -> int:
    """Chunks of 32 k times token tiles of 8, each rounded up to a power of two."""
    def power_of_two(v: int) -> int:
        return 1 << max(v - 1, 0).bit_length()
    return power_of_two(-(-k // 32)) * power_of_two(-(-m // 8))


def devices() -> list[str]:
    return ["cpu"] + (["cuda"] if gpu_available() else [])


def algorithm_params() -> list:
    """(device, algorithm) for every registered algorithm; CUDA entries exist only on a GPU."""
    return [pytest.param(d, name, id=f"{d}-{name}") for d in devices() for name in mmv.algorithms(d)]


def dtype_params(rungs, with_auto: bool = False) -> list:
    """(device, algorithm, dtype) for each (device, algorithm) of `rungs` and each dtype it takes;
    with `with_auto`, also "auto" with each dtype that one of them takes on its device. float32
    on a GPU comes twice: as PyTorch runs it by default (TF32 off: the tensor-core rungs run it in
    3xTF32) and, marked `tf32`, with TF32 allowed (tf32_mode), where they run it in TF32."""
    params = [(d, name, t) for d, name in rungs for t in mmv._C.algorithm_dtypes(d, name)]
    if with_auto:
        params += [(d, "auto", t) for d, t in dict.fromkeys((d, t) for d, _, t in params)]
    plain = [pytest.param(d, name, DTYPE_BY_C10_NAME[t], id=f"{d}-{name}-{t}")
             for d, name, t in params]
    tf32 = [pytest.param(d, name, torch.float32, id=f"{d}-{name}-Float-tf32",
                         marks=pytest.mark.tf32)
            for d, name, t in params if d.startswith("cuda") and t == "Float"]
    return plain + tf32


def algorithm_dtype_params(with_auto: bool = False) -> list:
    """dtype_params for every registered algorithm of every device."""
    return dtype_params([(d, name) for d in devices() for name in mmv.algorithms(d)], with_auto)


@pytest.fixture(autouse=True)
def tf32_mode(request):
    """A test marked `tf32` runs with torch.backends.cuda.matmul.allow_tf32 on."""
    if request.node.get_closest_marker("tf32") is None:
        yield
        return
    with tf32_allowed():
        yield


def runs_in_tf32(dtype: torch.dtype, device) -> bool:
    """Whether the tensor-core rungs run a product in `dtype` on `device` in TF32: float32 on a GPU
    while TF32 is allowed."""
    on_gpu = torch.device(device).type == "cuda"
    return dtype == torch.float32 and on_gpu and torch.backends.cuda.matmul.allow_tf32


def tolerance_for(dtype: torch.dtype, device) -> float:
    """The relative error allowed for a product in `dtype` on `device`: TF32's where it runs in
    TF32 (runs_in_tf32), else the dtype's."""
    return TF32_TOLERANCE if runs_in_tf32(dtype, device) else TOLERANCE[dtype]


def input_rounding(dtype: torch.dtype, device) -> float:
    """The relative error of each product of inputs in `dtype` on `device`: TF32's or 3xTF32's for
    float32 on a GPU (where the tensor-core rungs run it so), none elsewhere (16-bit products are
    exact in float32)."""
    if dtype != torch.float32 or torch.device(device).type != "cuda":
        return 0.0
    return TF32_INPUT_ROUNDING if runs_in_tf32(dtype, device) else SPLIT_TF32_INPUT_ROUNDING


def element_bound(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The error allowed in each element of a @ b (a batch too) computed in a's dtype and device:
    (output rounding + input rounding + K accumulation steps) * (|a| @ |b|) in float64, plus the
    spacing of the dtype's subnormals, where an output's rounding is absolute."""
    dtype, k = a.dtype, a.shape[-1]
    unit = OUTPUT_ROUNDING[dtype] + input_rounding(dtype, a.device) + k * ACCUMULATION_STEP[dtype]
    finfo = torch.finfo(dtype)
    return unit * (a.double().abs() @ b.double().abs()) + finfo.tiny * finfo.eps + 1e-30


def assert_elements_within_bound(out: torch.Tensor, ref: torch.Tensor, a: torch.Tensor,
                                 b: torch.Tensor) -> None:
    """Every element of out = a @ b within element_bound of the float64 reference `ref`: an error
    confined to a few elements (one tile's edge, one K split) hides in the relative error of the
    whole output. Infinite and NaN references are left to the tests that make them."""
    bound = element_bound(a, b)
    finite = ref.isfinite() & bound.isfinite()
    excess = torch.where(finite, (out.double() - ref).abs() / bound, torch.zeros_like(ref))
    excess = excess.nan_to_num(nan=float("inf"))  # a NaN output where float64 is finite fails
    if excess.numel() == 0 or excess.max() <= 1:
        return
    flat = int(excess.argmax())
    index = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), ref.shape))
    got, want = out[index].item(), ref[index].item()
    raise AssertionError(f"element {index}: {got!r} against float64 {want!r}, error "
                         f"{abs(got - want):.3e} > bound {bound[index].item():.3e}")


def relative_error(out: torch.Tensor, ref: torch.Tensor, scale: float | None = None) -> float:
    """||out - ref|| / scale, by default ||ref||."""
    scale = ref.norm().item() if scale is None else scale
    diff = (out.double() - ref).norm().item()
    return diff / scale if scale > 0 else diff


def padded(x: int) -> int:
    """x rounded up to a multiple of 64 elements (128 bytes or more)."""
    return 64 * ((x + 63) // 64)


def random_matrix(rows, cols, dtype, device, layout="row"):
    """A random [rows, cols] matrix: row-major, a transposed view ("col"), either of them with
    its leading dimension padded to a multiple of 64 elements ("padded-row", "padded-col"), so
    that 16-byte copies and TMA can address it whatever rows and cols are, a slice with a
    storage offset and a padded row stride ("sliced"), or contiguous one element into its storage
    ("offset"), so that neither its pointer nor (for a bias) its elements are 16-byte aligned."""
    if layout == "padded-row":
        return torch.randn(rows, padded(cols), device=device).to(dtype)[:, :cols]
    if layout == "padded-col":
        return torch.randn(cols, padded(rows), device=device).to(dtype)[:, :rows].t()
    if layout == "row":
        return torch.randn(rows, cols, device=device).to(dtype)
    if layout == "col":
        return torch.randn(cols, rows, device=device).to(dtype).t()
    if layout == "sliced":
        return torch.randn(rows + 1, cols + 3, device=device).to(dtype)[1:, 2:2 + cols]
    if layout == "offset":
        return torch.randn(rows * cols + 1, device=device).to(dtype)[1:].view(rows, cols)
    raise ValueError(layout)


@contextlib.contextmanager
def tf32_allowed():
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous


def run_accepted(algorithm, a, b, run):
    """Calls run() and returns (its output, the tolerance for a's dtype and device), or None when
    `algorithm` refuses inputs like the 2-D product a @ b by design (e.g. a skinny kernel given
    many rows), after checking that run() refuses them with the algorithm's reason."""
    accepted, why = (True, "") if algorithm == "auto" else mmv._C.algorithm_accepts(algorithm, a, b)
    if accepted:
        return run(), tolerance_for(a.dtype, a.device)
    with pytest.raises(RuntimeError, match=re.escape(why)):
        run()
    return None


def rows_accepted(algorithm, m, k, n, dtype, device) -> int:
    """The most rows, up to m, that `algorithm` takes against a [k, n] b, or m where it takes none
    (run_accepted then checks its refusal). A rung made for a few tokens refuses the off-tile row
    counts the tests use, and a refused product checks no value."""
    b = torch.empty(k, n, dtype=dtype, device=device)
    for rows in range(m, 0, -1):
        a = torch.empty(rows, k, dtype=dtype, device=device)
        if algorithm == "auto" or mmv._C.algorithm_accepts(algorithm, a, b)[0]:
            return rows
    return m


def run_checked(a, b, algorithm):
    """run_accepted for the op itself: mmv.matmul(a, b, algorithm)."""
    return run_accepted(algorithm, a, b, lambda: mmv.matmul(a, b, algorithm))


def check_bmm(a, b, algorithm) -> bool:
    """run_accepted for a batch a [B, M, K] against b [B, K, N] or a shared [K, N], asking
    whether `algorithm` takes one entry's product, then checks the batch against float64
    (assert_product); returns False when the algorithm refused."""
    result = run_accepted(algorithm, a[0], b if b.dim() == 2 else b[0],
                          lambda: mmv.matmul(a, b, algorithm))
    if result is None:
        return False
    assert_product(result[0], a, b, result[1])
    return True


def assert_result(out, ref, dtype, device, tolerance, scale=None):
    """A fresh contiguous output of the inputs' dtype and device, every element written, within
    `tolerance` of the float64 reference by relative error (relative to `scale` where given)."""
    assert out.shape == ref.shape and out.dtype == dtype and out.device == device
    assert out.is_contiguous()
    assert not torch.isnan(out).any(), "unwritten (NaN-poisoned) or NaN elements in the output"
    err = relative_error(out, ref, scale)
    assert err <= tolerance, f"relative error {err:.3e} > {tolerance:.1e}"


def assert_product(out, a, b, tolerance):
    """out = a @ b (a batch too) against the float64 product: assert_result's checks, and every
    element within its bound (assert_elements_within_bound)."""
    ref = a.double() @ b.double()
    assert_result(out, ref, a.dtype, a.device, tolerance)
    assert_elements_within_bound(out, ref, a, b)


def assert_matches_reference(a, b, algorithm):
    """Checks the op against a float64 product (assert_product); returns False when the algorithm
    refused."""
    result = run_checked(a, b, algorithm)
    if result is None:
        return False
    assert_product(result[0], a, b, result[1])
    return True


def assert_gradients_match(algorithm, a, b, op, reference, inputs, roundings=1):
    """Checks the gradients of op(*inputs), for a random output gradient, against those of
    `reference` (torch ops) on float64 copies of the same inputs, within the dtype's tolerance
    (times `roundings`, where the gradients pass through more than one rounding to the dtype).
    a @ b is the 2-D product the op runs, for run_accepted; returns False when the algorithm
    refuses it."""
    leaves64 = [t.detach().double().requires_grad_() for t in inputs]
    out64 = reference(*leaves64)
    grad_out = torch.randn_like(out64).to(inputs[0].dtype)
    expected = torch.autograd.grad(out64, leaves64, grad_out.double())

    def run():
        leaves = [t.detach().requires_grad_() for t in inputs]
        return torch.autograd.grad(op(*leaves), leaves, grad_out)

    result = run_accepted(algorithm, a, b, run)
    if result is None:
        return False
    grads, tolerance = result
    tolerance *= roundings
    for i, (grad, ref) in enumerate(zip(grads, expected)):
        assert grad.dtype == inputs[i].dtype and grad.shape == inputs[i].shape
        err = relative_error(grad, ref)
        assert err <= tolerance, f"input {i}'s gradient: relative error {err:.3e} > {tolerance:.1e}"
    return True


def kernel_sass(name_part: str) -> list[tuple[str, str]]:
    """(mangled name, SASS) of every compiled kernel of the extension whose name contains
    `name_part`, from cuobjdump; skips the test when cuobjdump is missing, fails when no kernel
    matches."""
    from torch.utils.cpp_extension import CUDA_HOME
    candidates = [shutil.which("cuobjdump")]
    if CUDA_HOME:
        candidates.append(os.path.join(CUDA_HOME, "bin", "cuobjdump"))
    cuobjdump = next((c for c in candidates if c and os.path.exists(c)), None)
    if cuobjdump is None:
        pytest.skip("cuobjdump not found")
    result = subprocess.run([cuobjdump, "-sass", mmv._C.__file__], capture_output=True, text=True,
                            check=True)
    functions = re.split(r"^\s*Function : ", result.stdout, flags=re.MULTILINE)[1:]
    kernels = [(f.split("\n", 1)[0].strip(), f) for f in functions
               if name_part in f.split("\n", 1)[0]]
    assert kernels, f"no {name_part} in the SASS of {mmv._C.__file__}"
    return kernels


def on_side_stream(work):
    """Returns work(), run on a new stream ordered after everything queued on the current one,
    which in turn waits for it."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        result = work()
    torch.cuda.current_stream().wait_stream(side)
    return result


def launched_kernels(run) -> list[dict]:
    """The kernel events of what run() launches, from the profiler's trace: each one's name, and
    its launch grid in args."""
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
        run()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "trace.json")
        profile.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    return [e for e in events if e.get("cat") == "kernel"]


# The kernels of each rung made for a few tokens (rungs 10-12), by the file that holds them.
SKINNY_RUNG_KERNELS = {"skinny": ("skinny_kernel", "short_rows_kernel"),
                       "skinny_tma": ("skinny_tma_kernel",),
                       "skinny_gemv": ("k_major_kernel", "short_k_kernel", "n_major_kernel")}


def kernels_of_rung(names: list[str], algorithm: str) -> list[str]:
    """The names among `names` of kernels that skinny rung `algorithm` holds."""
    return [name for name in names
            if any(f"::{kernel}<" in name for kernel in SKINNY_RUNG_KERNELS[algorithm])]


def product_kernels(run) -> list[str]:
    """The names of the package's kernels that run() launches to multiply: not ATen's copies or
    fills, nor the pass that adds the partial sums of blocks that split K (split_kernels)."""
    return [e["name"] for e in launched_kernels(run) if "mm_variants" in e["name"]
            and "sum_splits_kernel" not in e["name"]]


def split_kernels(run) -> list[str]:
    """The passes that add K splits' partial sums among the kernels that run() launches."""
    return [e["name"] for e in launched_kernels(run) if "sum_splits_kernel" in e["name"]]


def capture_graph(work, stream=None):
    """(graph, work()'s result) with work() captured into the CUDA graph rather than run. Kernels
    that load modules or opt into shared memory on first use need a warm-up call first (e.g.
    on_side_stream(work)), since a capture forbids those. Work on another device than the
    process's first capture needs a `stream` of its own there: torch.cuda.graph's default side
    stream stays on the device it was made for, and work on another device's stream would run
    at once instead of being captured."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        result = work()
    return graph, result


@pytest.fixture
def one_large_test_at_a_time(tmp_path_factory):
    """Runs the tests that use it one at a time across pytest-xdist's workers (whose temporary
    folders share a parent), so that their products of several GB never meet in GPU memory.
    Where there is no fcntl (Windows), they are not serialized."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    with open(tmp_path_factory.getbasetemp().parent / "large_tests.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


@pytest.fixture(autouse=True)
def poison_outputs():
    """Every output starts as NaN, so an element a kernel does not write fails the test."""
    mmv._C.set_poison_outputs(True)
    yield
    mmv._C.set_poison_outputs(False)


@pytest.fixture
def dying_cuda_context(monkeypatch):
    """A fake CUDA context for a CPU run, killed by appending to the list returned (as a kernel's
    illegal memory access does): from then on torch.cuda.is_initialized() is True (before, False,
    as on a machine without a GPU) and torch.cuda.synchronize() raises."""
    dead = []

    def synchronize(device=None):
        if dead:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: bool(dead))
    monkeypatch.setattr(torch.cuda, "synchronize", synchronize)
    return dead


def failing_while_timed(monkeypatch, name, message, dead=None) -> list:
    """Makes mmv.matmul raise `message` for algorithm `name` while the list returned is not
    empty, as a kernel that passes its check and fails when timed; bench.time_ms fills the list
    while it runs, and a test's own timer can too. Given dying_cuda_context's list as `dead`, the
    error kills the fake CUDA context."""
    timing, product, time_ms = [], mmv.matmul, bench.time_ms

    def matmul(a, b, algorithm="auto"):
        if algorithm == name and timing:
            if dead is not None:
                dead.append(name)
            raise RuntimeError(f"{message}\nException raised from launch()")
        return product(a, b, algorithm)

    def timed(step, device, repeat):
        timing.append(step)
        try:
            return time_ms(step, device, repeat)
        finally:
            timing.pop()

    monkeypatch.setattr(mmv, "matmul", matmul)
    monkeypatch.setattr(bench, "time_ms", timed)
    return timing
