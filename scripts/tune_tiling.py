"""The tile sweeps behind the default configurations of the warp_tiling and tensor_core rungs
(torch_mm_variants/csrc/cuda/07_warp_tiling.cu, 08_tensor_core.cu).

Builds the rung once per candidate configuration, each a small extension of its own (the rung's
source, the registry, the epilogue's host side, and a binding that runs the rung from that
registry) with the rung's tiling macro predefined through a pre-included header, builds them in
parallel, then checks each against a float64 reference and times it with triton.testing.do_bench
(median) at SIZE^3, with torch.mm timed right before and after it in the same
process (heating and clock changes then affect both alike): each candidate is compared with the
mean of the two. A is row-major; B is row-major for warp_tiling, and for tensor_core w.t() of an
nn.Linear weight w [N, K]: the layouts the macro's tiling serves (tensor_core takes a row-major B
in its DeepTiling where that fits, which the macro does not set). A candidate whose stages need
more shared memory than the GPU allows a block is not timed (the rung would run another tiling
in its place). The fastest configuration is the rung's default. --output writes the rows as
JSON. A candidate that fails its check, or raises there or while timed, gets a failed row and
the sweep goes on (exit status 1); where the error left the CUDA context dead, it stops there
and writes the rows measured so far. Needs the package itself built in place (for its
benchmark's helpers). The builds need a CUDA build of torch and the CUDA toolkit; with
--build-only they need no GPU where TORCH_CUDA_ARCH_LIST names the architecture to build for.

    python3 scripts/tune_tiling.py --rung warp_tiling                 # float32, TF32 off
    python3 scripts/tune_tiling.py --rung tensor_core --dtype bfloat16 --sizes 4096,8192
    python3 scripts/tune_tiling.py --rung tensor_core --dtype float32  # TF32 on
    python3 scripts/tune_tiling.py ... --build-only                     # no GPU work
    python3 scripts/tune_tiling.py --rung tensor_core --candidates "128,256,128,64,64,3,1;..."
    python3 scripts/tune_tiling.py --rung warp_tiling --output warp_tiling.json
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CSRC = os.path.join(ROOT, "torch_mm_variants", "csrc")
sys.path.insert(0, ROOT)
from torch_mm_variants import bench  # noqa: E402  (the checkout's package, built in place)


@dataclass(frozen=True)
class Rung:
    source: str
    macro: str
    fields: str  # the macro's parameters; the first five are always BM, BN, BK.., WM, WN
    candidates: tuple
    tf32: bool  # whether float32 inputs run in TF32 (then torch.mm gets TF32 too)
    b_k_contiguous: bool = False  # B as w.t(), the layout whose tiling the macro sets
    # The shared memory a block of a configuration needs, in bytes, where the rung runs another
    # tiling for one that does not fit (None: it has no such fallback).
    smem_bytes: object = None


def tensor_core_smem_bytes(config) -> int:
    """08_tensor_core.cu's Tiles::kSmemBytes: the stages of A and B (BK_BYTES of k a row,
    whatever the dtype), or the epilogue's float staging of 16 rows per warp, whichever is
    larger."""
    bm, bn, bk_bytes, wm, wn, stages, _ = config
    return max(stages * (bm + bn) * bk_bytes, (bm // wm) * (bn // wn) * 16 * (wn + 8) * 4)


RUNGS = {
    # Block tile, warp tile, thread tile, and the resident blocks per SM that __launch_bounds__
    # budgets registers for.
    "warp_tiling": Rung("07_warp_tiling.cu", "MM_VARIANTS_WARP_TILING",
                        "BM, BN, BK, WM, WN, TM, TN, MIN_BLOCKS", (
                            (128, 128, 8, 64, 32, 8, 8, 2),
                            (128, 128, 8, 32, 64, 8, 8, 2),
                            (128, 128, 16, 64, 32, 8, 8, 2),
                            (64, 128, 8, 32, 64, 8, 8, 4),
                            (128, 64, 8, 64, 32, 8, 8, 4),
                            (128, 128, 8, 64, 64, 8, 16, 2),
                            (128, 256, 8, 64, 64, 8, 16, 1),
                            (256, 128, 8, 64, 64, 16, 8, 1),
                        ), tf32=False),
    # Block tile, bytes of K per stage, warp tile, pipeline stages, resident blocks per SM. The
    # swizzled stages need 128-byte rows (BK_BYTES = 128) and warp tiles of 64 x 64 or more.
    "tensor_core": Rung("08_tensor_core.cu", "MM_VARIANTS_TENSOR_CORE",
                        "BM, BN, BK_BYTES, WM, WN, STAGES, MIN_BLOCKS", (
                            (128, 256, 128, 64, 64, 3, 1),
                            (128, 256, 128, 64, 64, 4, 1),
                            (128, 256, 128, 64, 64, 2, 1),
                            (256, 128, 128, 64, 64, 3, 1),
                            (128, 128, 128, 64, 64, 3, 2),
                            (128, 128, 128, 64, 64, 2, 2),
                        ), tf32=True, b_k_contiguous=True, smem_bytes=tensor_core_smem_bytes),
}

BINDING = r"""
#include <torch/extension.h>
#include "registry.h"

at::Tensor run(const at::Tensor& a, const at::Tensor& b) {
  at::Tensor out = at::empty({a.size(0), b.size(1)}, a.options());
  mm_variants::find_algorithm(a.device(), "RUNG").run(a, b, out);
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("run", &run); }
"""


def tag(config) -> str:
    return "_".join(map(str, config))


def write_if_changed(path: str, text: str) -> str:
    """Writes `text` to `path` unless it is there already: a new mtime would make ninja rebuild."""
    if not os.path.exists(path) or open(path).read() != text:
        with open(path, "w") as f:
            f.write(text)
    return path


def build(rung_name: str, config, root: str):
    """Builds (or finds built) the extension for one configuration and returns the module."""
    from torch.utils.cpp_extension import load

    rung = RUNGS[rung_name]
    name = f"mm_variants_{rung_name}_{tag(config)}"
    directory = os.path.join(root, name)
    os.makedirs(directory, exist_ok=True)
    header = write_if_changed(os.path.join(directory, "config.h"),
                              f"#define {rung.macro} {', '.join(map(str, config))}\n")
    binding = write_if_changed(os.path.join(directory, "binding.cpp"),
                               BINDING.replace("RUNG", rung_name))
    return load(name=name,
                sources=[os.path.join(CSRC, "cuda", rung.source),
                         os.path.join(CSRC, "registry.cpp"), os.path.join(CSRC, "epilogue.cpp"),
                         binding],
                extra_include_paths=[CSRC],
                extra_cflags=["-O3", "-std=c++17"],
                extra_cuda_cflags=["-O3", "-std=c++17", "--expt-relaxed-constexpr",
                                   "-include", header],
                build_directory=directory, verbose=False)


def build_only(rung_name: str, config, root: str) -> str:
    build(rung_name, config, root)
    return tag(config)


def parse_args(argv=None) -> argparse.Namespace:
    """The options, with --candidates as a tuple of configurations (the rung's by default)."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rung", choices=sorted(RUNGS), required=True)
    parser.add_argument("--dtype", choices=["float32", "float16", "bfloat16"], default=None,
                        help="float32 for warp_tiling, bfloat16 for tensor_core by default")
    parser.add_argument("--sizes", type=bench.positive_ints, default="4096",
                        help="comma-separated square sizes")
    parser.add_argument("--jobs", type=bench.positive_int, default=os.cpu_count() or 1)
    parser.add_argument("--build-only", action="store_true",
                        help="build the candidates and stop (no GPU work: can overlap other runs; "
                             "without a GPU, set TORCH_CUDA_ARCH_LIST to the one to build for)")
    parser.add_argument("--candidates", default=None,
                        help="';'-separated configurations (the macro's fields, comma-separated) "
                             "instead of the rung's list")
    parser.add_argument("--build-dir", default=os.path.join(tempfile.gettempdir(),
                                                            "mm_variants_tune_tiling"))
    parser.add_argument("--output", default=None, help="also write the rows as JSON to this file")
    args = parser.parse_args(argv)
    if args.output is not None:
        bench.check_writable(parser, "--output", args.output, (".json",))
    args.candidates = parse_candidates(parser, args.rung, args.candidates)
    return args


def parse_candidates(parser, rung_name: str, text: str | None) -> tuple:
    """--candidates's configurations, each as many integers as the rung's macro has fields (a
    usage error otherwise, rather than a compile error after the builds have started)."""
    rung = RUNGS[rung_name]
    if text is None:
        return rung.candidates
    fields = rung.fields.split(", ")
    try:
        candidates = tuple(tuple(int(x) for x in c.split(",")) for c in text.split(";"))
    except ValueError:
        parser.error(f"--candidates {text!r}: not ';'-separated lists of comma-separated integers")
    for config in candidates:
        named = ",".join(map(str, config))
        if len(config) != len(fields):
            parser.error(f"--candidates: {named} has {len(config)} fields; "
                         f"{rung_name}'s are {rung.fields}")
        if min(config) < 1:
            parser.error(f"--candidates: {named} has a field below 1 ({rung.fields})")
        bm, bn, _, wm, wn, *_ = config
        if bm % wm or bn % wn:
            parser.error(f"--candidates: {named}: the warp tile {wm} x {wn} does not divide the "
                         f"block tile {bm} x {bn}")
    if len(set(candidates)) < len(candidates):  # they would build into one directory at once
        parser.error("--candidates: a configuration is given more than once")
    return candidates


def measure(rung_name: str, candidates, a, b, run_of, time_ms, tf32: bool,
            smem_limit: int | None = None) -> tuple[list, float]:
    """A row per candidate, and torch.mm's median time. Each candidate (`run_of(config)`, its
    product) is checked against a float64 a @ b, then timed (`time_ms(fn)`: one timing of
    fn(a, b)) with torch.mm right before and after it, and compared with the mean of the two.
    A candidate beyond the tolerance, or that raises, is not timed; one whose timing raises
    fails too; so does one needing more than `smem_limit` bytes of shared memory a block, where
    the rung would run another tiling. bench.ContextLost, with the rows so far, where an error
    left the CUDA context dead."""
    rung = RUNGS[rung_name]
    n, dtype = a.shape[0], a.dtype
    ref = a.double() @ b.double()
    tolerance = 1e-5 if dtype == torch.float32 and not tf32 else 1e-2
    device_label = bench.device_name(a.device)  # in every row: the data names its GPU
    beside, rows = bench.BesideTorchMm(lambda: time_ms(torch.mm)), []
    for config in candidates:
        needs = rung.smem_bytes(config) if rung.smem_bytes else 0
        if smem_limit is not None and needs > smem_limit:
            err, error = float("nan"), (f"needs {needs} bytes of shared memory a block, the GPU "
                                        f"allows {smem_limit}: another tiling would run")
        else:
            run = run_of(config)
            err, error = bench.check(run, [(a, b)], [ref])
        ms = mm_ms = float("nan")
        if err < tolerance:
            ms, mm_ms, error = beside.time(lambda: time_ms(run))
        ok = err < tolerance and error is None
        bm, bn, _, wm, wn, *_ = config
        rows.append({"device_name": device_label, "rung": rung_name,
                     "dtype": str(dtype).removeprefix("torch."), "tf32": tf32, "size": n,
                     "config": dict(zip(rung.fields.split(", "), config)),
                     "threads": bm // wm * (bn // wn) * 32, "ms": ms,
                     "tflops": 2.0 * n ** 3 / ms / 1e9 if ms > 0 else bench.NOT_TIMED,
                     "torch_mm_ms": mm_ms,
                     "pct_of_torch_mm": 100 * mm_ms / ms if ms > 0 else bench.NOT_TIMED,
                     "rel_error": err,
                     "ok": ok, "error": error})
        print(f"timed {tag(config)}: {ms:.3f} ms (torch.mm {mm_ms:.3f} ms)" if ok
              else f"FAILED {tag(config)}: {error}" if error
              else f"not timed {tag(config)}: rel. error {err:.1e} (above {tolerance:.0e})",
              flush=True)
        bench.stop_if_context_lost(error, rows)
    mm_ms, error = beside.torch_mm_time()
    if error is not None:
        print(f"torch.mm not timed: {error}", flush=True)
        bench.stop_if_context_lost(error, rows)
    return rows, mm_ms


def time_candidates(rung_name: str, candidates, dtype: torch.dtype, n: int,
                    build_dir: str) -> list[dict]:
    """Measures the candidates at n^3 on the GPU, prints their table (fastest first) and
    returns their rows."""
    from triton.testing import do_bench

    rung = RUNGS[rung_name]
    torch.manual_seed(0)
    a = torch.randn(n, n, device="cuda", dtype=dtype)
    b = torch.randn(n, n, device="cuda", dtype=dtype)
    if rung.b_k_contiguous:
        b = b.t()
    tf32 = dtype == torch.float32 and rung.tf32
    # What a block may opt in to: the SM's shared memory less the 1 KB the CUDA runtime reserves
    # for each block (sm_80 on: 227 KB on an H100, 163 KB on an A100, 99 KB on an RTX 4090).
    smem_limit = torch.cuda.get_device_properties(a.device).shared_memory_per_multiprocessor - 1024

    def time_ms(fn) -> float:
        return float(do_bench(lambda: fn(a, b), warmup=100, rep=500, return_mode="median"))

    rows, mm_ms = measure(rung_name, candidates, a, b,
                          lambda config: build(rung_name, config, build_dir).run, time_ms, tf32,
                          smem_limit)
    print(f"\n{rung_name} candidates at {n}^3 {str(dtype)[6:]}{' (TF32)' if tf32 else ''} on "
          f"{torch.cuda.get_device_name()}, torch.mm timed right before and after each "
          f"(median {mm_ms:.3f} ms)\n")
    print(f"| {rung.fields} | threads | ms | TFLOP/s | % of torch.mm | rel. error |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for r in sorted(rows, key=lambda r: (r["ms"] != r["ms"], r["ms"])):
        print(f"| {', '.join(map(str, r['config'].values()))} | {r['threads']} | {r['ms']:.3f} "
              f"| {r['tflops']:.1f} | {r['pct_of_torch_mm']:.1f}% | {r['rel_error']:.1e} |")
    return rows


def missing_for(build_only: bool) -> str | None:
    """What this machine lacks for the run, or None: said before the builds, which otherwise
    fail later with a traceback (an AssertionError where no GPU is visible)."""
    from torch.utils.cpp_extension import CUDA_HOME

    gpu = torch.cuda.is_available()
    if not build_only and not gpu:
        return "timing the candidates needs a CUDA GPU (--build-only builds without one)"
    if torch.version.cuda is None:
        return f"torch {torch.__version__} is a CPU-only build: the builds need its CUDA headers"
    if CUDA_HOME is None:
        return "no CUDA toolkit found (nvcc): set CUDA_HOME to build the candidates"
    if not gpu and "TORCH_CUDA_ARCH_LIST" not in os.environ:
        return ("no GPU visible to build for: set TORCH_CUDA_ARCH_LIST (e.g. 9.0a for an H100) "
                "to build without one")
    return None


def main(argv=None) -> int:
    args = parse_args(argv)
    rung = RUNGS[args.rung]
    candidates = args.candidates
    missing = missing_for(args.build_only)
    if missing:
        sys.exit(f"tune_tiling: {missing}")
    if "TORCH_CUDA_ARCH_LIST" not in os.environ:  # the visible GPU's (missing_for saw one)
        major, minor = torch.cuda.get_device_capability()
        os.environ["TORCH_CUDA_ARCH_LIST"] = f"{major}.{minor}" + ("a" if major == 9 else "")
    os.environ.setdefault("MAX_JOBS", "2")
    count = len(candidates)
    with ProcessPoolExecutor(min(args.jobs, count), mp_context=get_context("spawn")) as pool:
        for done in pool.map(build_only, [args.rung] * count, candidates,
                             [args.build_dir] * count):
            print(f"built {done}", flush=True)
    if args.build_only:
        return 0
    dtype = getattr(torch, args.dtype or ("bfloat16" if rung.tf32 else "float32"))
    torch.backends.cuda.matmul.allow_tf32 = rung.tf32
    rows, lost = [], None
    try:
        for n in args.sizes:
            rows += time_candidates(args.rung, candidates, dtype, n, args.build_dir)
    except bench.ContextLost as error:  # written with the rest, and the run stops
        rows, lost = rows + error.rows, error
    if args.output:
        bench.write_json(rows, args.output)
        print(f"\nwrote {len(rows)} rows to {args.output}")
    if lost:
        print(f"tune_tiling: {lost}", file=sys.stderr)
    return 0 if all(r["ok"] for r in rows) and not lost else 1


if __name__ == "__main__":
    sys.exit(main())
