"""The benchmark: every registered algorithm beside torch.mm, checked and timed.

    python -m torch_mm_variants.bench                       # GPU 4096^3 float32, else CPU 1024^3
    python -m torch_mm_variants.bench --device cpu --sizes 1024,2048 --output cpu.json
    python -m torch_mm_variants.bench --dtype bfloat16 --sizes 4096x14336x4096 --algorithms auto
    python -m torch_mm_variants.bench --dtype bfloat16 --algorithms wgmma --rounds 3  # spread
    python -m torch_mm_variants.bench --tf32 --a-transposed  # dy.t() @ x, a weight's gradient

For each size, each algorithm's result on every input set is first compared with a float64
reference (the worst relative error is reported), then timed (median after warm-up: device
events through triton.testing.do_bench on the GPU, perf_counter on the CPU). torch.mm is timed
right beside every algorithm, in the same process, and each algorithm's "% of torch.mm" is
against that neighbouring measurement, so clock drift and heating affect both alike. Inputs are
random, and several input sets are cycled when one set would fit in the GPU's L2 cache. With
--rounds R the whole measurement runs R times over and a last table gives each algorithm's
median and range of "% of torch.mm" across the rounds: the run-to-run spread that a single
figure hides.

A kernel whose result fails the check, or that raises during the check or while timed, gets a
failed row (with the error's first line) and the run goes on; the exit status is then 1. Where
the error left the CUDA context dead (an illegal memory access), the run stops there, writes the
rows measured so far, and exits with status 1.
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass

import torch

import torch_mm_variants as mmv

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
          "float64": torch.float64}
# Worst-case relative error ||out - ref|| / ||ref|| accepted per dtype (TF32 for float32 on
# tensor cores when --tf32 is given).
TOLERANCE = {torch.float64: 1e-12, torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 1e-2}
TF32_TOLERANCE = 5e-3
BASELINE = "torch.mm"


def runs_in_tf32(dtype: torch.dtype, device: torch.device, allowed: bool) -> bool:
    """Whether products of `dtype` on `device` run in TF32 (torch.mm's and ours alike) where
    TF32 is `allowed`: float32 on a GPU only."""
    return allowed and dtype == torch.float32 and device.type == "cuda"


def tolerance_for(dtype: torch.dtype, tf32: bool) -> float:
    """The worst relative error accepted for `dtype`, TF32's for float32 when TF32 is allowed."""
    return TF32_TOLERANCE if (tf32 and dtype == torch.float32) else TOLERANCE[dtype]


@dataclass
class Row:
    device: str
    device_name: str  # the GPU's (or CPU's) name: a ratio to torch.mm means little without it
    dtype: str
    m: int
    n: int
    k: int
    algorithm: str
    ms: float
    gflops: float
    pct_of_torch_mm: float
    rel_error: float
    ok: bool
    round: int = 1
    error: str | None = None  # what the kernel raised, for a row that failed that way
    # The run's conditions, which the printed headings give: a row read alone says them too.
    tf32: bool = False  # float32 on a GPU with TF32 allowed (torch.mm's and ours alike)
    weight_layout: bool = False  # b = w.t() for an nn.Linear weight w [N, K]
    a_transposed: bool = False  # a = x.t() for an x [K, M]


# The rate of a row that was not timed: written as null (JSON) or nan (CSV), never as 0.
NOT_TIMED = float("nan")


def parse_size(text: str) -> tuple[int, int, int]:
    """'4096' -> (4096, 4096, 4096); 'MxNxK' -> (M, N, K)."""
    try:
        parts = [int(p) for p in text.lower().split("x")]
    except ValueError:
        parts = []
    if parts and min(parts) < 1:
        raise argparse.ArgumentTypeError(f"size {text!r} has a dimension below 1")
    if len(parts) == 1:
        return parts[0], parts[0], parts[0]
    if len(parts) == 3:
        return parts[0], parts[1], parts[2]
    raise argparse.ArgumentTypeError(f"size {text!r} is neither N nor MxNxK")


def make_inputs(m, n, k, dtype, device, sets, weight_layout=False, a_transposed=False):
    """`sets` random (a, b) pairs; with weight_layout, b is w.t() for a weight w [N, K], as in
    nn.Linear; with a_transposed, a is x.t() for an x [K, M], as in a weight's gradient
    dy.t() @ x."""
    def matrix(rows, cols, transposed):
        if transposed:
            return torch.randn(cols, rows, device=device).to(dtype).t()
        return torch.randn(rows, cols, device=device).to(dtype)
    return [(matrix(m, k, a_transposed), matrix(k, n, weight_layout)) for _ in range(sets)]


MAX_INPUT_SETS = 1024  # see input_sets_needed


def input_sets_needed(m, n, k, dtype, device) -> int:
    """Enough input sets that cycling them cannot be served from the GPU's L2 cache: the
    operands read over one cycle come to three times L2. Outputs are not counted: each call's
    output is freed before the next, whose new one the caching allocator puts in the same place.
    A bound of 8 sets left products up to 1024^3 in bfloat16 (8 x 4 MB) in the 50 MB of an H100's
    L2. The bound of 1024 sets caps only products whose operands come to under 150 KB on an
    H100 (smaller than 256^3 in float16): read from memory, those take a small fraction of a
    microsecond, nothing beside a kernel launch, and a 1x1x1 product would need millions of
    sets."""
    if device.type != "cuda":
        return 1
    l2_bytes = torch.cuda.get_device_properties(device).L2_cache_size
    operand_bytes = (m * k + k * n) * dtype.itemsize
    return min(MAX_INPUT_SETS, max(1, math.ceil(3 * l2_bytes / max(operand_bytes, 1))))


def cycling(fn, inputs):
    """A no-argument callable that runs fn on the next input set each call."""
    state = {"i": 0}

    def step():
        a, b = inputs[state["i"] % len(inputs)]
        state["i"] += 1
        return fn(a, b)
    return step


def time_ms(step, device, repeat: int) -> float:
    """Median milliseconds of one call of `step`, after warm-up."""
    if device.type == "cuda":
        try:
            from triton.testing import do_bench
            return float(do_bench(step, warmup=25, rep=max(repeat * 10, 50), return_mode="median"))
        except ImportError:
            return _time_cuda_events(step, repeat)
    step()  # warm-up
    times, budget_end = [], time.perf_counter() + 3.0
    for i in range(max(repeat, 3)):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
        if i >= 2 and time.perf_counter() > budget_end:
            break
    return 1e3 * statistics.median(times)


def _time_cuda_events(step, repeat: int) -> float:
    for _ in range(3):
        step()
    times = []
    for _ in range(max(repeat, 10)):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    diff = (out.double() - ref).norm().item()
    scale = ref.norm().item()
    return diff / scale if scale > 0 else diff


def attempt(fn) -> tuple[float, str | None]:
    """fn()'s value and None; or NaN and the first line of what fn raised (its C++ frames follow
    on the lines below), for a row that then says it failed."""
    try:
        return fn(), None
    except Exception as error:  # noqa: BLE001  (any kernel error; Ctrl-C still ends the run)
        lines = str(error).splitlines() or [""]
        return float("nan"), f"{type(error).__name__}: {lines[0]}"


def check(product, inputs, references) -> tuple[float, str | None]:
    """The worst relative error of product(a, b) over the input sets against their float64
    references, and None; or NaN and the first line of what the product raised. A kernel that
    raises where algorithm_accepts took the inputs is then reported as failed, not timed, and the
    run goes on with the rows measured so far."""
    return attempt(lambda: max(relative_error(product(a, b), reference)
                               for (a, b), reference in zip(inputs, references)))


class BesideTorchMm:
    """torch.mm timed right before and right after each algorithm, so that heating and clock
    changes affect both alike: each algorithm is compared with the mean of its two neighbours,
    and torch.mm's own time is the median of all of them. `time_torch_mm` is any no-argument
    callable that times torch.mm once; the algorithms' callables give the same unit. Another
    baseline (model_bench's original model) gives its name as `baseline`, for its errors."""

    def __init__(self, time_torch_mm, baseline: str = "torch.mm beside it"):
        self.time_torch_mm = time_torch_mm
        self.baseline = baseline
        self.times: list[float] = []

    def time(self, time_algorithm) -> tuple[float, float, str | None]:
        """time_algorithm()'s time, the mean of torch.mm's right before and after it, and None;
        or NaN, NaN and the first line of what one of the three timings raised (a CUDA error,
        do_bench's own failure), for a failed row: the run goes on (see stop_if_context_lost)."""
        timings = []
        baseline = f"{self.baseline}: "
        for what, fn in ((baseline, self.time_torch_mm), ("", time_algorithm),
                         (baseline, self.time_torch_mm)):
            value, error = attempt(fn)
            if error is not None:
                return float("nan"), float("nan"), what + error
            timings.append(value)
        before, ms, after = timings
        self.times += [before, after]
        return ms, (before + after) / 2, None

    def torch_mm_time(self) -> tuple[float, str | None]:
        """The median of torch.mm's timings, or one timing of its own where no algorithm was
        timed; and None, or the first line of what that timing raised."""
        if self.times:
            return statistics.median(self.times), None
        return attempt(self.time_torch_mm)


class ContextLost(Exception):
    """A failure left the CUDA context dead: the run stops. `rows` holds the rows measured at
    the shape, the failed one last, for the caller to write with those of earlier shapes."""

    def __init__(self, error: str, rows: list):
        super().__init__(f"the CUDA context is lost ({error}): every later CUDA call would fail, "
                         f"so the run stopped there")
        self.rows = rows


def cuda_context_alive() -> bool:
    """Whether CUDA calls still work. A sticky error (an illegal memory access, a kernel's trap)
    fails every later call of the process, a synchronize among them; an ordinary one (a
    TORCH_CHECK, a launch refused) leaves the context usable. True where CUDA was never
    initialized: a CPU run has no context to lose."""
    if not torch.cuda.is_initialized():
        return True
    try:
        torch.cuda.synchronize()
    except Exception:  # noqa: BLE001  (whatever the dead context answers)
        return False
    return True


def stop_if_context_lost(error: str | None, rows: list) -> None:
    """After a row that failed with `error` (None: it did not raise) has been added to `rows`:
    ContextLost with them when the failure killed the CUDA context. Going on would fail every
    later row the same way, and end the run at the next CUDA call outside a check or a timing
    with a traceback and no rows written."""
    if error is not None and not cuda_context_alive():
        raise ContextLost(error, rows)


def progress(message: str) -> None:
    """A status line that the next one overwrites, on a terminal only: in a log the control
    characters would only pile up."""
    if sys.stderr.isatty():
        print(f"\r\033[K{message}", end="", file=sys.stderr, flush=True)


def bench_size(m, n, k, dtype, device, algorithms, repeat, tf32,
               weight_layout=False, a_transposed=False) -> list[Row]:
    inputs = make_inputs(m, n, k, dtype, device, input_sets_needed(m, n, k, dtype, device),
                         weight_layout, a_transposed)
    a0, b0 = inputs[0]
    # Every set's product is checked, not the first only: the timed calls run on all of them.
    references = [a.double() @ b.double() for a, b in inputs]
    tolerance = tolerance_for(dtype, tf32)
    flop = 2.0 * m * n * k
    device_label = device_name(device)
    # torch.mm is checked before it is timed beside the others: a wrong one is not timed either.
    baseline_err, baseline_error = check(torch.mm, inputs, references)
    baseline_ok = baseline_err <= tolerance

    def time_baseline() -> float:
        return time_ms(cycling(torch.mm, inputs), device, repeat) if baseline_ok else NOT_TIMED

    beside, rows = BesideTorchMm(time_baseline), []
    tf32_used = runs_in_tf32(dtype, device, tf32)

    def row(name, ms, baseline_ms, err, error=None):
        return Row(str(device), device_label, str(dtype).removeprefix("torch."), m, n, k, name,
                   ms, flop / ms / 1e6 if ms > 0 else NOT_TIMED,
                   100.0 * baseline_ms / ms if ms > 0 else NOT_TIMED, err,
                   err <= tolerance and error is None, error=error, tf32=tf32_used,
                   weight_layout=weight_layout, a_transposed=a_transposed)

    for index, name in enumerate(algorithms):
        progress(f"[{index + 1}/{len(algorithms)}] {name} at {m}x{n}x{k} {dtype}")
        if name != "auto":
            accepted, why = mmv._C.algorithm_accepts(name, a0, b0)
            if not accepted:  # e.g. a skinny kernel at large M
                print(f"\n{name} at {m}x{n}x{k}: not run: {why}", file=sys.stderr)
                continue
        label = f"auto ({mmv.auto_choice(a0, b0)})" if name == "auto" else name
        product = lambda a, b: mmv.matmul(a, b, name)  # noqa: E731
        err, error = check(product, inputs, references)
        ms = baseline_ms = float("nan")
        if err <= tolerance:  # a wrong or raising kernel is reported, never timed
            ms, baseline_ms, error = beside.time(
                lambda: time_ms(cycling(product, inputs), device, repeat))
        if error:
            print(f"\n{name} at {m}x{n}x{k}: FAILED: {error}", file=sys.stderr)
        rows.append(row(label, ms, baseline_ms, err, error))
        stop_if_context_lost(error, rows)
    baseline_ms, error = beside.torch_mm_time()
    rows.append(row(BASELINE, baseline_ms, baseline_ms, baseline_err, error or baseline_error))
    stop_if_context_lost(error or baseline_error, rows)
    progress("")
    return rows


def format_table(rows: list[Row]) -> str:
    lines = ["| algorithm | ms | GFLOP/s | % of torch.mm | rel. error |",
             "| --- | ---: | ---: | ---: | ---: |"]
    for r in rows:
        status = "" if r.ok else f" FAILED{f' ({r.error})' if r.error else ''}"
        lines.append(f"| {r.algorithm} | {r.ms:.3f} | {r.gflops:.1f} | {r.pct_of_torch_mm:.1f}% "
                     f"| {r.rel_error:.1e}{status} |")
    return "\n".join(lines)


def format_spread(rows: list[Row]) -> str:
    """Per size and algorithm: the median and the range of % of torch.mm over the rounds."""
    runs: dict[tuple, list[float]] = {}
    for r in rows:
        if r.ok and r.algorithm != BASELINE:
            runs.setdefault((r.m, r.n, r.k, r.algorithm), []).append(r.pct_of_torch_mm)
    lines = ["| M x N x K | algorithm | rounds | median % of torch.mm | range |",
             "| --- | --- | ---: | ---: | ---: |"]
    for (m, n, k, name), pcts in runs.items():
        lines.append(f"| {m}x{n}x{k} | {name} | {len(pcts)} | {statistics.median(pcts):.1f}% "
                     f"| {min(pcts):.1f}-{max(pcts):.1f}% |")
    return "\n".join(lines)


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU ({torch.get_num_threads()} threads, SIMD {mmv._C.cpu_isa()})"


def write_rows(rows: list[Row], path: str) -> None:
    records = [asdict(r) for r in rows]
    if path.endswith(".csv"):
        with open(path, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(records[0]))
            writer.writeheader()
            writer.writerows(records)
    else:
        write_json(records, path)


def write_json(records: list[dict], path: str) -> None:
    """The records as JSON, a NaN or infinity (the times of a row not timed) written as null:
    JSON has no NaN, and strict parsers (jq, JavaScript's JSON.parse) reject Python's."""
    def finite(value):
        return None if isinstance(value, float) and not math.isfinite(value) else value
    with open(path, "w") as f:
        json.dump([{key: finite(value) for key, value in record.items()} for record in records],
                  f, indent=1, allow_nan=False)


def use_device(device: torch.device, program: str) -> torch.device:
    """`device` with its index (cuda -> cuda:0), made the current CUDA device: do_bench's events
    and L2 flush, and the kernels' streams, are the current device's, so timing a cuda:1 from
    cuda:0 would measure nothing. Exits with a message when no CUDA GPU is visible."""
    if device.type != "cuda":
        return device
    if not torch.cuda.is_available():
        sys.exit(f"{program}: --device {device} but no CUDA GPU is visible")
    device = torch.device("cuda", device.index if device.index is not None else 0)
    torch.cuda.set_device(device)
    return device


def parse_device(p: argparse.ArgumentParser, text: str) -> torch.device:
    """--device's value as a torch.device, or argparse's usage error naming it (a CUDA device
    where no GPU is visible too, before its algorithms are looked up)."""
    try:
        device = torch.device(text)
    except RuntimeError as error:
        p.error(f"--device {text!r}: {error}")
    if device.type == "cuda" and not torch.cuda.is_available():
        p.error(f"--device {text}: no CUDA GPU is visible")
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        p.error(f"--device {text}: there are {torch.cuda.device_count()} visible GPUs, "
                f"cuda:0 to cuda:{torch.cuda.device_count() - 1}")
    return device


def check_writable(p: argparse.ArgumentParser, option: str, path: str,
                   suffixes: tuple[str, ...] = ()) -> None:
    """argparse's usage error unless `path` can be written as a file (ending in one of
    `suffixes`, where given: the format written follows it): checked before the run, which may
    take minutes, rather than when its results are written at the end."""
    if not path:
        p.error(f"{option}: the file name is empty")
    if suffixes and not path.endswith(suffixes):
        p.error(f"{option} {path!r}: the file name must end in {' or '.join(suffixes)}")
    if os.path.isdir(path):
        p.error(f"{option} {path!r}: that is a directory; give a file name")
    if os.path.islink(path) and not os.path.exists(path):
        p.error(f"{option} {path!r}: a link to {os.readlink(path)!r}, which does not exist")
    if os.path.exists(path) and not os.access(path, os.W_OK):
        p.error(f"{option} {path!r}: the file exists and is not writable")
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory) or not os.access(directory, os.W_OK | os.X_OK):
        p.error(f"{option} {path!r}: directory {directory!r} does not exist or is not writable")


def positive_int(text: str) -> int:
    """An argparse type: a whole number of at least 1 (repetitions, rounds, token counts)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1")
    return value


def positive_ints(text: str) -> list[int]:
    """An argparse type: comma-separated whole numbers of at least 1 (token counts, sizes)."""
    return [positive_int(item) for item in text.split(",")]


def positive_float(text: str) -> float:
    """An argparse type: a number above 0 (seconds)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be above 0")
    return value


def parse_algorithms(text: str | None, device: torch.device,
                     available: list[str] | None = None) -> list[str]:
    """The names of a comma-separated --algorithms value (default: auto and every algorithm of
    `device`, or `available` where given); ValueError naming those that it lacks, and the valid
    ones."""
    available = mmv.algorithms(device) if available is None else available
    names = text.split(",") if text is not None else ["auto"] + available
    if "" in names:
        raise ValueError("an empty name (none given, two commas, or one at an end)")
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ValueError(f"named more than once: {', '.join(repeated)}")
    unknown = [name for name in names if name != "auto" and name not in available]
    if unknown:
        raise ValueError(f"unknown algorithm(s) {', '.join(unknown)} for {device}; valid: auto, "
                         f"{', '.join(available)}")
    return names


def parse_args(argv=None):
    gpu = torch.cuda.is_available() and mmv.has_cuda()
    p = argparse.ArgumentParser(prog="python -m torch_mm_variants.bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if gpu else "cpu", help="cpu, cuda or cuda:N")
    p.add_argument("--dtype", default="float32", choices=list(DTYPES))
    p.add_argument("--sizes", default=None,
                   help="comma-separated N or MxNxK (default 4096 on the GPU, 1024 on the CPU)")
    p.add_argument("--algorithms", default=None,
                   help="comma-separated names (default: auto and every algorithm of the device)")
    p.add_argument("--repeat", type=positive_int, default=10, help="timed repetitions (CPU) / scale (GPU)")
    p.add_argument("--tf32", action="store_true",
                   help="allow TF32 for float32 (torch.mm and the tensor-core rungs alike; "
                        "CUDA only)")
    p.add_argument("--weight-layout", action="store_true",
                   help="b is w.t() for an nn.Linear weight w [N, K] instead of a row-major [K, N]")
    p.add_argument("--a-transposed", action="store_true",
                   help="a is x.t() for an x [K, M] (as in a weight's gradient dy.t() @ x) "
                        "instead of a row-major [M, K]")
    p.add_argument("--rounds", type=positive_int, default=1,
                   help="run every measurement this many times and summarize the spread")
    p.add_argument("--output", default=None, help="write the rows to this .json or .csv file")
    args = p.parse_args(argv)
    device = parse_device(p, args.device)
    if device.type != "cuda" and args.tf32:
        # It would only loosen the check of float32 results to TF32's tolerance.
        p.error("--tf32: TF32 is a CUDA mode; the CPU's float32 products are checked as float32")
    if args.output is not None:
        check_writable(p, "--output", args.output, (".json", ".csv"))
    if mmv.algorithms(device):  # else main says the build has no kernels for the device
        try:
            args.algorithms = parse_algorithms(args.algorithms, device)
        except ValueError as error:
            p.error(f"--algorithms {args.algorithms!r}: {error}")
    if args.sizes is not None:
        try:
            args.sizes = [parse_size(text) for text in args.sizes.split(",")]
        except argparse.ArgumentTypeError as error:
            p.error(f"--sizes {args.sizes!r}: {error}")
        if len(set(args.sizes)) < len(args.sizes):  # each would count as rounds of the other
            p.error("--sizes: a size is given more than once")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    device = use_device(torch.device(args.device), "torch_mm_variants.bench")
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = args.tf32
    dtype = DTYPES[args.dtype]
    sizes = args.sizes or [parse_size("4096" if device.type == "cuda" else "1024")]
    if not mmv.algorithms(device):
        sys.exit(f"torch_mm_variants.bench: this build has no kernels for {device}")
    names = args.algorithms
    torch.manual_seed(0)

    all_rows, lost = [], None
    print(f"# torch_mm_variants benchmark on {device_name(device)}, torch {torch.__version__}, "
          f"{args.dtype}{' (TF32 allowed)' if args.tf32 else ''}")
    try:
        for round_ in range(1, args.rounds + 1):
            for m, n, k in sizes:
                rows = bench_size(m, n, k, dtype, device, names, args.repeat, args.tf32,
                                  args.weight_layout, args.a_transposed)
                all_rows += report(rows, (m, n, k), round_, args)
    except ContextLost as error:  # its shape's rows so far, then what the run has, are written
        lost = error
        all_rows += report(lost.rows, (m, n, k), round_, args)
    if args.rounds > 1:
        print(f"\n## Across {args.rounds} rounds\n")
        print(format_spread(all_rows), flush=True)
    if args.output:
        write_rows(all_rows, args.output)
        print(f"\nwrote {len(all_rows)} rows to {args.output}")
    if lost:
        print(f"\ntorch_mm_variants.bench: {lost}", file=sys.stderr)
    return 1 if lost or not all(r.ok for r in all_rows) else 0


def report(rows: list[Row], size, round_: int, args) -> list[Row]:
    """Prints one size's table, its rows numbered with their round, and returns them."""
    m, n, k = size
    for r in rows:
        r.round = round_
    a_form = f"a = x.t(), x [{k}, {m}], " if args.a_transposed else ""
    b_form = f"b = w.t(), w [{n}, {k}]" if args.weight_layout else f"b [{k}, {n}]"
    of_rounds = f", round {round_} of {args.rounds}" if args.rounds > 1 else ""
    print(f"\n## {m}x{n}x{k} (M x N x K, {a_form}{b_form}{of_rounds})\n")
    print(format_table(rows), flush=True)
    return rows


if __name__ == "__main__":
    sys.exit(main())
