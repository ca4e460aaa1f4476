"""Benchmark of the skinny rungs and `auto` on LLM decode shapes: out = x @ w.t() for an
nn.Linear weight w [N, K] and M tokens, beside torch.mm on the same x and w.t(). With
--weight row-major the weight is stored [K, N] instead, row by row (out = x @ w, as for a
weight kept [in, out]). With --batch B, x is [B, M, K] and each of the B entries has its own
matrix, beside torch.bmm: attention at decode, q @ k^T (--shapes LxD for a key cache [B, L, D],
D the head size, L the context) and attn @ v (--shapes DxL --weight row-major for values
[B, L, D]), or a batch of experts' weights.

    python scripts/bench_skinny.py
    python scripts/bench_skinny.py --m 1,16 --shapes 4096x14336 --dtypes bfloat16 --output rows.json
    python scripts/bench_skinny.py --weight row-major --timing graph
    python scripts/bench_skinny.py --batch 32 --m 1 --shapes 4096x128 --dtypes float32

Each (M, N, K) and algorithm is checked against a float64 product first, then timed, torch.mm
right before and after it; its speed-up is over the mean of the two, and the torch.mm column
gives the median of all of them. An algorithm that does not take a shape (a skinny rung past
M = 64, a dtype it lacks) shows "-"; one whose check fails shows WRONG, and one that raises shows
ERROR with the message: neither is timed, both are written with ok=false, and the exit status
is 1. One whose timing raises shows ERROR too. Where an error leaves the CUDA context dead (an
illegal memory access), the run stops there, writes the rows measured so far and exits with
status 1. torch.mm and ours rotate over enough weight copies that L2 cannot hold them, so every
call streams its weight from memory, as in decode. GB/s counts the weight bytes only (all B
entries' with --batch, whose rows give torch.bmm's time where they say torch.mm). Two ways
of timing (--timing):
- flush (default): triton.testing.do_bench, median of single calls, each after do_bench has
  cleared L2 by writing a 256 MB buffer. The call's reads then also push those dirty lines back
  to memory, which costs every kernel alike.
- graph: calls back to back in a CUDA graph, as decode runs in serving engines that capture it;
  the median over replays of the time per call.
- eager: calls back to back from Python, as an eager decode loop makes them; the median over
  repeats of the wall time per call, the host's dispatch and launch included (where those take
  longer than the kernel, the host's rate is what shows).
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch_mm_variants as mmv  # noqa: E402  (the checkout's package, built in place)
from torch_mm_variants import bench  # noqa: E402

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--m", type=bench.positive_ints, default="1,8,16,32,64",
                   help="comma-separated token counts M")
    p.add_argument("--shapes", type=weight_shapes, default="4096x4096,14336x4096,4096x14336",
                   help="comma-separated NxK weight shapes")
    p.add_argument("--dtypes", type=dtype_names, default="bfloat16,float16",
                   help=f"comma-separated, any of {', '.join(DTYPES)}")
    p.add_argument("--algorithms", default=None,
                   help="comma-separated mm_variants algorithms to time (default: auto and every "
                        "skinny rung this GPU lists)")
    p.add_argument("--batch", type=bench.positive_int, default=None,
                   help="B entries, each x [M, K] against its own weight (torch.bmm's "
                        "product; default: one product, torch.mm's)")
    p.add_argument("--weight", choices=WEIGHT_LAYOUTS, default="linear",
                   help="the weight as nn.Linear's w [N, K] (read as w.t(), K-contiguous) or "
                        "stored row-major [K, N]")
    p.add_argument("--timing", choices=TIMINGS, default="flush",
                   help="single calls after an L2 clear, back-to-back calls in a CUDA graph, or "
                        "back-to-back calls from Python (eager)")
    p.add_argument("--output", default=None, help="also write the rows as JSON to this file")
    args = p.parse_args(argv)
    if args.output is not None:
        bench.check_writable(p, "--output", args.output, (".json",))
    if args.algorithms is not None:  # names the build has, checked before any GPU work
        try:
            bench.parse_algorithms(args.algorithms, torch.device("cuda"),
                                   mmv._C.registered_algorithms())
        except ValueError as error:
            p.error(f"--algorithms {args.algorithms!r}: {error}")
    return args


# argparse types: a bad value is a usage error when parsed, not a traceback once the GPU is up.
def weight_shapes(text: str) -> list[tuple[int, int]]:
    """Comma-separated NxK, each dimension at least 1."""
    return [weight_shape(shape) for shape in text.split(",")]


def weight_shape(text: str) -> tuple[int, int]:
    dims = text.lower().split("x")
    try:
        if len(dims) != 2:
            raise argparse.ArgumentTypeError("not NxK")
        return bench.positive_int(dims[0]), bench.positive_int(dims[1])
    except argparse.ArgumentTypeError as error:  # which shape of the list, and why
        raise argparse.ArgumentTypeError(f"shape {text!r}: {error}") from None


def dtype_names(text: str) -> list[str]:
    """Comma-separated names from DTYPES."""
    names = text.split(",")
    unknown = [name for name in names if name not in DTYPES]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown dtype(s) {', '.join(unknown)}; valid: "
                                         f"{', '.join(DTYPES)}")
    return names


WEIGHT_LAYOUTS = ("linear", "row-major")


def weight_copy(n: int, k: int, dtype: torch.dtype, layout: str, device="cuda",
                batch: int | None = None) -> torch.Tensor:
    """A random weight w as the benchmark multiplies it, x @ w.mT: an nn.Linear weight [N, K]
    ("linear"), or the transpose of one stored [K, N] ("row-major"), whose w.mT is that
    row-major matrix; with `batch`, B of them, [B, N, K] or [B, K, N] transposed."""
    entries = () if batch is None else (batch,)
    if layout == "row-major":
        return torch.randn(*entries, k, n, device=device).to(dtype).mT
    return torch.randn(*entries, n, k, device=device).to(dtype)


def copies_needed(weight_bytes: int) -> int:
    """Weight copies whose rotation cannot be served from L2, up to bench's bound on input sets
    (a 1 x 1 weight would need millions)."""
    l2 = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size
    return min(bench.MAX_INPUT_SETS, max(2, math.ceil(3 * l2 / weight_bytes)))


def flush_us(fn, inputs) -> float:
    from triton.testing import do_bench
    state = {"i": 0}

    def step():
        x, w = inputs[state["i"] % len(inputs)]
        state["i"] += 1
        return fn(x, w.mT)
    # do_bench clears L2 before every call; 25 ms of calls gives thousands of samples here.
    return 1e3 * float(do_bench(step, warmup=5, rep=25, return_mode="median"))


def rotation(inputs, calls: int) -> list:
    """The inputs in turn for at least `calls` calls, and for every copy at least once: fewer
    calls than copies would leave the rest unread, and L2 could hold the ones read."""
    return [inputs[i % len(inputs)] for i in range(max(calls, len(inputs)))]


def graph_us(fn, inputs, calls: int = 48, replays: int = 15) -> float:
    """Per call, of `calls` calls (or one per input, if more) over the rotated inputs captured
    in one CUDA graph."""
    sequence = rotation(inputs, calls)
    side = torch.cuda.Stream()  # first calls (shared-memory opt-ins) outside the capture
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for x, w in sequence[:len(inputs)]:
            fn(x, w.mT)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for x, w in sequence:
            fn(x, w.mT)
    graph.replay()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(1e3 * start.elapsed_time(end) / len(sequence))
    return statistics.median(times)


def eager_us(fn, inputs, calls: int = 48, repeats: int = 15) -> float:
    """Per call, of `calls` calls (or one per input, if more) over the rotated inputs issued from
    Python without waiting for the GPU in between: wall time from an idle GPU until the last
    call's work is done."""
    sequence = rotation(inputs, calls)
    for x, w in sequence[:len(inputs)]:  # first calls (shared-memory opt-ins) untimed
        fn(x, w.mT)
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for x, w in sequence:
            fn(x, w.mT)
        torch.cuda.synchronize()
        times.append(1e6 * (time.perf_counter() - start) / len(sequence))
    return statistics.median(times)


TIMINGS = ("flush", "graph", "eager")


def measure(inputs, algorithms, time_us, tolerance: float, baseline=torch.mm):
    """One (M, N, K): a result per algorithm, and the time of torch.mm (`baseline`: torch.bmm
    for a batch) as the median of its timings.
    An algorithm that does not take these inputs (dtype, or M past a skinny rung's) is skipped
    with its reason; one whose product fails the check against float64, or raises, is not
    timed. torch.mm is timed right before and after each algorithm, which is compared with the
    mean of the two, so that heating and clock changes affect both alike. A timing that raises
    fails its algorithm's result; where torch.mm's own timing raises (no algorithm was timed), a
    failed result for torch.mm says so. bench.ContextLost, with the results so far, where an
    error left the CUDA context dead."""
    x, w = inputs[0]
    # Every copy's product is checked, not the first only: the timed calls run on all of them.
    products = [(x_, w_.mT) for x_, w_ in inputs]
    references = [x_.double() @ w_.double().mT for x_, w_ in inputs]
    # torch.mm is checked before it is timed beside the others: a wrong one is not timed.
    baseline_err, baseline_error = bench.check(baseline, products, references)
    baseline_ok = baseline_err <= tolerance
    results = []
    beside = bench.BesideTorchMm(
        lambda: time_us(baseline, inputs) if baseline_ok else float("nan"))
    for algorithm in algorithms:
        # A batch's entries are products of their own: an algorithm takes the batch where it
        # takes one entry (one launch or a launch per entry, as torch_mm_variants.matmul runs it).
        accepted, why = mmv._C.algorithm_accepts(algorithm, x.reshape(-1, *x.shape[-2:])[0],
                                                 w.reshape(-1, *w.shape[-2:])[0].mT)
        if not accepted:
            results.append({"algorithm": algorithm, "skipped": why})
            continue
        product = lambda a, b: mmv.matmul(a, b, algorithm)  # noqa: E731
        err, error = bench.check(product, products, references)
        us = torch_mm_us = float("nan")
        if err <= tolerance:  # a wrong or raising kernel is reported, never timed
            us, torch_mm_us, error = beside.time(lambda: time_us(product, inputs))
        results.append({"algorithm": algorithm, "us": us, "torch_mm_us": torch_mm_us,
                        "speedup": torch_mm_us / us, "rel_error": err,
                        "ok": err <= tolerance and error is None, "error": error})
        bench.stop_if_context_lost(error, results)
    baseline_us, error = beside.torch_mm_time()
    error = error or baseline_error
    if error is not None or not baseline_ok:
        results.append({"algorithm": bench.BASELINE, "us": baseline_us, "ok": False,
                        "rel_error": baseline_err, "error": error})
        bench.stop_if_context_lost(error, results)
    return results, baseline_us


def cell(result: dict) -> str:
    """A result's cell in the table."""
    if "skipped" in result:
        return "-"
    if not result["ok"]:
        return (f"ERROR ({result['error']})" if result["error"]
                else f"WRONG ({result['rel_error']:.1e})")
    return f"{result['us']:.1f} ({result['speedup']:.2f}x)"


def report(case: dict, weight_bytes: int, results: list, baseline_us: float,
           rows: list) -> bool:
    """Prints the table line of one (dtype, M, N, K), `case`, and adds its rows to `rows`;
    whether every algorithm there (and torch.mm's own timing) succeeded."""
    measured = [r for r in results if "skipped" not in r]
    failed_mm = [r for r in results if r["algorithm"] == bench.BASELINE]
    # torch.mm's (torch.bmm's) row too, timed or failed, under its own name, as the table has it.
    baseline_row = failed_mm or ([{"algorithm": bench.BASELINE, "us": baseline_us, "ok": True,
                                   "error": None}] if baseline_us == baseline_us else [])
    baseline = {"algorithm": "torch.mm" if case["batch"] is None else "torch.bmm"}
    rows += [{**case, **r, "gbs": weight_bytes / r["us"] / 1e3}
             for r in measured if r["algorithm"] != bench.BASELINE]
    rows += [{**case, **r, **baseline, "gbs": weight_bytes / r["us"] / 1e3} for r in baseline_row]
    times = [r["us"] for r in measured if r["ok"]]
    best = weight_bytes / min(times) / 1e3 if times else float("nan")
    batch = "" if case["batch"] is None else f"| {case['batch']} "
    print(f"{batch}| {case['dtype']} | {case['m']} | {case['n']} | {case['k']} "
          f"| {cell(failed_mm[0]) if failed_mm else f'{baseline_us:.1f}'} "
          f"| {weight_bytes / baseline_us / 1e3:.0f} | "
          + " | ".join(cell(r) for r in results if r["algorithm"] != bench.BASELINE)
          + f" | {best:.0f} |", flush=True)
    return all(r["ok"] for r in measured)


def cases(dtypes: list[str], shapes: list[tuple[int, int]], ms: list[int], layout: str,
          batch: int | None = None):
    """(dtype name, M, N, K, weight bytes, inputs) for each point: x [M, K] ([B, M, K] with
    `batch`) with each of the weight copies (weight_copy), as many as L2 cannot hold."""
    entries = () if batch is None else (batch,)
    for dtype_name in dtypes:
        dtype = DTYPES[dtype_name]
        for n, k in shapes:
            weight_bytes = (batch or 1) * n * k * dtype.itemsize
            weights = [weight_copy(n, k, dtype, layout, batch=batch)
                       for _ in range(copies_needed(weight_bytes))]
            for m in ms:
                yield dtype_name, m, n, k, weight_bytes, [
                    (torch.randn(*entries, m, k, device="cuda").to(dtype), w) for w in weights]
            del weights  # before the next shape's copies are made


def product_text(layout: str, batch: int | None) -> str:
    """The header's words for the product timed."""
    x = "x [M, K]" if batch is None else f"x [B, M, K], B = {batch}"
    product = "x @ w, w [K, N] row-major" if layout == "row-major" else "x @ w.t(), w [N, K]"
    return f"{x}; {product}" + ("" if batch is None else " per entry")


def main(argv=None) -> int:
    args = parse_args(argv)
    if not (torch.cuda.is_available() and mmv.has_cuda()):
        sys.exit("bench_skinny: needs a GPU and a CUDA build of torch_mm_variants")
    torch.manual_seed(0)
    algorithms = (args.algorithms.split(",") if args.algorithms else
                  ["auto"] + [a for a in mmv.algorithms("cuda") if a.startswith("skinny")])
    time_us = {"flush": flush_us, "graph": graph_us, "eager": eager_us}[args.timing]
    gpu = torch.cuda.get_device_name()  # in every row too: the data names its GPU
    baseline, name = (torch.mm, "torch.mm") if args.batch is None else (torch.bmm, "torch.bmm")
    print(f"# {', '.join(algorithms)} vs {name} on {gpu}, torch {torch.__version__}; "
          f"{product_text(args.weight, args.batch)}; us (speed-up over {name}), "
          f"{args.timing} timing")
    batch_column = ("", "") if args.batch is None else ("| B ", "| ---: ")
    print(f"{batch_column[0]}| dtype | M | N | K | {name} us | {name} GB/s | "
          + " | ".join(algorithms) + " | best GB/s |")
    print(f"{batch_column[1]}| --- | ---: | ---: | ---: | ---: | ---: | "
          + "---: | " * len(algorithms) + "---: |")
    rows, ok, lost = [], True, None
    for dtype_name, m, n, k, weight_bytes, inputs in cases(args.dtypes, args.shapes, args.m,
                                                          args.weight, args.batch):
        try:
            results, baseline_us = measure(inputs, algorithms, time_us,
                                           bench.TOLERANCE[DTYPES[dtype_name]], baseline)
        except bench.ContextLost as error:  # written with the rest, and the run stops
            lost, results, baseline_us = error, error.rows, float("nan")
        case = {"device_name": gpu, "dtype": dtype_name, "batch": args.batch, "m": m, "n": n,
                "k": k, "weight": args.weight, "timing": args.timing}
        ok = report(case, weight_bytes, results, baseline_us, rows) and ok
        if lost:
            break
    if args.output:
        bench.write_json(rows, args.output)
    if lost:
        print(f"bench_skinny: {lost}", file=sys.stderr)
    return 0 if ok and not lost else 1


if __name__ == "__main__":
    sys.exit(main())
