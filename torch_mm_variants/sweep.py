"""The sweep: TFLOP/s (and GB/s) against size for every algorithm, auto and torch.mm.

    python -m torch_mm_variants.sweep --dtype bfloat16 --output sweep.csv --plot sweep.png

Two families of shapes: squares (M = N = K) and the nn.Linear shapes of real models, with the
weight given as [N, K] (b = w.t()) and M the number of tokens, from decode (M = 1) to prefill.
Each point is checked against a float64 reference before it is timed (bench.py's tolerances and
timer); torch.mm is timed right before and after each algorithm, and the row's torch_mm_ms and
pct_of_torch_mm compare it with the mean of the two. A point beyond the tolerance, or whose
kernel raised (its row's error gives the message), is not timed, its row says ok=False, FAILED
is printed for it, and the exit status is 1; so is a point whose timing raised. Where an error
left the CUDA context dead (an illegal memory access), the sweep stops there and writes the
rows measured so far. A kernel whose last point took longer than --time-cap seconds is not run
at larger sizes of that family (the teaching rungs at 8192^3), and a kernel is not run at
shapes it does not take (the skinny rungs beyond their M, float32 tensor-core rungs with TF32
off); both are listed, with the reason, at the end.
"""
from __future__ import annotations

import argparse
import csv
import sys

import torch

import torch_mm_variants as mmv
from torch_mm_variants import bench

SQUARES = [256, 512, 1024, 2048, 4096, 8192]
LINEAR_NK = [(4096, 4096), (14336, 4096), (4096, 14336)]
LINEAR_M = [1, 8, 16, 32, 64, 256, 1024, 4096]


def shapes(device: torch.device) -> list[tuple[str, int, int, int, bool]]:
    """(family, M, N, K, weight_layout) in increasing size within each family."""
    if device.type == "cpu":  # sizes that finish in a few minutes on a small CPU
        return ([("square", s, s, s, False) for s in [64, 128, 256, 512, 1024]]
                + [(f"linear {n}x{k}", m, n, k, True) for n, k in [(1024, 1024)] for m in [1, 8, 64, 256]])
    return ([("square", s, s, s, False) for s in SQUARES]
            + [(f"linear {n}x{k}", m, n, k, True) for n, k in LINEAR_NK for m in LINEAR_M])


def measure(family, m, n, k, weight_layout, dtype, device, names, repeat, time_cap,
            tolerance):
    """Rows for one shape: each algorithm (unless capped) and torch.mm. A result further than
    `tolerance` from the float64 reference is reported as failed and not timed. torch.mm is
    timed right before and after each algorithm, and the algorithm's row compares it with the
    mean of the two; torch.mm's own row gives the median of all of them."""
    inputs = bench.make_inputs(m, n, k, dtype, device,
                               bench.input_sets_needed(m, n, k, dtype, device), weight_layout)
    a0, b0 = inputs[0]
    # Every set's product is checked, not the first only: the timed calls run on all of them.
    references = [a.double() @ b.double() for a, b in inputs]
    bytes_moved = (m * k + k * n + m * n) * a0.element_size()
    device_label = bench.device_name(device)  # in every row: the data names its GPU
    rows = []

    def row(name, ms, err, torch_mm_ms, error=None):
        return {"device_name": device_label, "family": family, "m": m, "n": n, "k": k,
                "dtype": str(dtype).removeprefix("torch."), "tf32": tf32,
                "algorithm": name, "ms": ms,
                "tflops": 2 * m * n * k / ms / 1e9 if ms > 0 else bench.NOT_TIMED,
                "gbps": bytes_moved / ms / 1e6 if ms > 0 else bench.NOT_TIMED,
                "torch_mm_ms": torch_mm_ms,
                "pct_of_torch_mm": 100.0 * torch_mm_ms / ms if ms > 0 else bench.NOT_TIMED,
                "rel_error": err, "ok": err <= tolerance and error is None, "error": error}

    # A row read alone says whether it ran in TF32.
    tf32 = bench.runs_in_tf32(dtype, device, torch.backends.cuda.matmul.allow_tf32)
    baseline_err, baseline_error = bench.check(torch.mm, inputs, references)
    baseline_ok = baseline_err <= tolerance  # a wrong torch.mm is not timed either

    def time_baseline() -> float:
        if not baseline_ok:
            return float("nan")
        return bench.time_ms(bench.cycling(torch.mm, inputs), device, repeat)

    beside = bench.BesideTorchMm(time_baseline)
    for name in names:
        if name in time_cap["over"]:
            time_cap["skipped"].add(name)  # named at the end, where a size passed it over
            continue
        if name != "auto":
            accepted, why = mmv._C.algorithm_accepts(name, a0, b0)
            if not accepted:  # e.g. skinny beyond its M: said at the end, not passed over
                time_cap["refused"].setdefault((name, why), []).append(f"{m}x{n}x{k}")
                continue
        run = lambda a, b, name=name: mmv.matmul(a, b, name)  # noqa: E731
        label = f"auto ({mmv.auto_choice(a0, b0)})" if name == "auto" else name
        err, error = bench.check(run, inputs, references)
        ms = torch_mm_ms = float("nan")
        if err <= tolerance:  # a wrong or raising kernel is reported, never timed
            ms, torch_mm_ms, error = beside.time(
                lambda: bench.time_ms(bench.cycling(run, inputs), device, repeat))
        rows.append(row(label, ms, err, torch_mm_ms, error))
        bench.stop_if_context_lost(error, rows)
        if ms > 1e3 * time_cap["seconds"]:
            time_cap["over"].add(name)
    baseline_ms, error = beside.torch_mm_time()
    rows.append(row(bench.BASELINE, baseline_ms, baseline_err, baseline_ms,
                    error or baseline_error))
    bench.stop_if_context_lost(error or baseline_error, rows)
    return rows


def plot(rows: list[dict], path: str, title: str) -> None:
    """One column per family: TFLOP/s on top, GB/s (what bounds skinny shapes) below."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    families = list(dict.fromkeys(r["family"] for r in rows))
    names = list(dict.fromkeys(r["algorithm"].split(" (")[0] for r in rows))
    # One colour per algorithm in every panel, though some (skinny) appear in only a few.
    palette = plt.get_cmap("tab10").colors + plt.get_cmap("Dark2").colors
    colors = {name: palette[i % len(palette)] for i, name in
              enumerate(n for n in names if n != bench.BASELINE)}
    colors[bench.BASELINE] = "black"
    fig, axes = plt.subplots(2, len(families), figsize=(5 * len(families), 8), squeeze=False)
    for column, family in enumerate(families):
        subset = [r for r in rows if r["family"] == family]
        for ax, metric, unit in [(axes[0][column], "tflops", "TFLOP/s"),
                                 (axes[1][column], "gbps", "GB/s")]:
            for name in names:
                points = [r for r in subset if r["algorithm"].split(" (")[0] == name]
                if not points:
                    continue
                ax.plot([r["m"] for r in points], [r[metric] for r in points], marker="o",
                        markersize=3, label=name, color=colors[name],
                        linewidth=2.5 if name == bench.BASELINE else 1.5)
            ax.set_xscale("log", base=2)
            ax.set_xlabel("M = N = K" if family == "square"
                          else f"M (tokens), weight [N, K] = {family.split()[1]}")
            ax.set_ylabel(unit)
            ax.set_title(family)
            ax.grid(True, alpha=0.3)
    handles = [plt.Line2D([], [], color=colors[n], marker="o", markersize=3, label=n)
               for n in names]
    fig.legend(handles=handles, loc="upper right", fontsize=8, ncol=min(len(names), 5))
    fig.suptitle(title, x=0.02, ha="left")
    fig.tight_layout(rect=(0, 0, 1, 0.94))
    fig.savefig(path, dpi=110)


def parse_args(argv=None) -> argparse.Namespace:
    """The options, with --algorithms and --families as lists checked against the device."""
    p = argparse.ArgumentParser(prog="python -m torch_mm_variants.sweep", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    gpu = torch.cuda.is_available() and mmv.has_cuda()
    p.add_argument("--device", default="cuda" if gpu else "cpu")
    p.add_argument("--dtype", default="bfloat16", choices=list(bench.DTYPES))
    p.add_argument("--algorithms", default=None, help="comma-separated (default: auto and all)")
    p.add_argument("--families", default=None, help="comma-separated family prefixes, e.g. square")
    p.add_argument("--repeat", type=bench.positive_int, default=5)
    p.add_argument("--time-cap", type=bench.positive_float, default=1.0,
                   help="seconds per call beyond which an algorithm stops growing in size")
    p.add_argument("--tf32", action="store_true",
                   help="allow TF32 for float32 (torch.mm and ours alike; CUDA only)")
    p.add_argument("--output", default="sweep.csv")
    p.add_argument("--plot", default="sweep.png", help="a .png (or .svg, .pdf) path; '' for none")
    args = p.parse_args(argv)
    device = bench.parse_device(p, args.device)
    bench.check_writable(p, "--output", args.output, (".csv",))
    if args.plot:
        bench.check_writable(p, "--plot", args.plot, (".png", ".svg", ".pdf"))
    if device.type != "cuda" and args.tf32:
        # It would only loosen the check of float32 results to TF32's tolerance.
        p.error("--tf32: TF32 is a CUDA mode; the CPU's float32 products are checked as float32")
    try:
        args.algorithms = bench.parse_algorithms(args.algorithms, device)
    except ValueError as error:
        p.error(f"--algorithms {args.algorithms!r}: {error}")
    families = list(dict.fromkeys(family for family, *_ in shapes(device)))
    args.families = args.families.split(",") if args.families is not None else families
    if "" in args.families:
        p.error("--families: an empty name (none given, two commas, or one at an end)")
    unmatched = [f for f in args.families if not any(name.startswith(f) for name in families)]
    if unmatched:
        p.error(f"--families: no family begins with {', '.join(map(repr, unmatched))}; "
                f"families: {', '.join(families)}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    device = bench.use_device(torch.device(args.device), "torch_mm_variants.sweep")
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = args.tf32
    dtype = bench.DTYPES[args.dtype]
    tolerance = bench.tolerance_for(dtype, args.tf32)
    todo = [s for s in shapes(device) if any(s[0].startswith(f) for f in args.families)]
    rows, caps, lost = [], {}, None
    for index, (family, m, n, k, weight_layout) in enumerate(todo):
        bench.progress(f"[{index + 1}/{len(todo)}] {family} {m}x{n}x{k}")
        cap = caps.setdefault(family, {"seconds": args.time_cap, "over": set(),
                                       "skipped": set(), "refused": {}})
        try:
            rows += measure(family, m, n, k, weight_layout, dtype, device, args.algorithms,
                            args.repeat, cap, tolerance)
        except bench.ContextLost as error:  # written with the rest, and the sweep stops
            rows += error.rows
            lost = error
            break
    bench.progress("")
    with open(args.output, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {len(rows)} rows to {args.output}")
    for family, cap in caps.items():
        if cap["skipped"]:
            print(f"{family}: not run past {args.time_cap:g} s per call: "
                  f"{', '.join(sorted(cap['skipped']))}")
        for (name, why), where in cap["refused"].items():
            print(f"{family}: {name} not run at {', '.join(where)}: {why}")
    failed = [r for r in rows if not r["ok"]]
    for r in failed:
        why = r["error"] or f"rel. error {r['rel_error']:.1e}"
        print(f"{r['family']} {r['m']}x{r['n']}x{r['k']} {r['algorithm']}: {why} FAILED"
              f"{'' if r['error'] else f' (above {tolerance:.0e})'}, not timed")
    timed = [r for r in rows if r["ok"]]
    if args.plot and timed:
        try:
            # The rows' name of the GPU: after a dead context, asking CUDA again might fail.
            plot(timed, args.plot, f"{timed[0]['device_name']}, {args.dtype}"
                                   f"{' (TF32 allowed)' if args.tf32 else ''}")
            print(f"wrote {args.plot}")
        except ImportError:
            print("matplotlib is not installed: no plot", file=sys.stderr)
    if lost:
        print(f"torch_mm_variants.sweep: {lost}", file=sys.stderr)
    return 1 if failed or lost else 0


if __name__ == "__main__":
    sys.exit(main())
