"""Benchmark of the skinny rung on LLM decode shapes: out = x @ w.t() for an nn.Linear weight
w [N, K] and M tokens, beside torch.mm on the same x and w.t().

    python scripts/bench_skinny.py
    python scripts/bench_skinny.py --m 1,16 --shapes 4096x14336 --dtypes bfloat16 --output rows.json

Each (M, N, K) is checked against a float64 product first, then timed with
triton.testing.do_bench (median), torch.mm before and after ours; torch.mm's time is the mean of
the two. Both rotate over enough weight copies that L2 cannot hold them, so every call streams
its weight from memory, as in decode. GB/s counts the weight bytes only.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch_mm_variants as mmv  # noqa: E402  (the checkout's package, built in place)

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
TOLERANCE = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 1e-2}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--m", default="1,8,16,32,64", help="comma-separated token counts M")
    p.add_argument("--shapes", default="4096x4096,14336x4096,4096x14336",
                   help="comma-separated NxK weight shapes")
    p.add_argument("--dtypes", default="bfloat16,float16", help=f"any of {', '.join(DTYPES)}")
    p.add_argument("--algorithm", default="skinny", help="the mm_variants algorithm to time")
    p.add_argument("--output", default=None, help="also write the rows as JSON to this file")
    return p.parse_args(argv)


def copies_needed(weight_bytes: int) -> int:
    """Weight copies whose rotation cannot be served from L2."""
    l2 = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size
    return max(2, math.ceil(3 * l2 / weight_bytes))


def time_us(fn, inputs) -> float:
    from triton.testing import do_bench
    state = {"i": 0}

    def step():
        x, w = inputs[state["i"] % len(inputs)]
        state["i"] += 1
        return fn(x, w.t())
    # do_bench clears L2 before every call; 25 ms of calls gives thousands of samples here.
    return 1e3 * float(do_bench(step, warmup=5, rep=25, return_mode="median"))


def relative_error(out, ref) -> float:
    return ((out.double() - ref).norm() / ref.norm()).item()


def main(argv=None) -> int:
    args = parse_args(argv)
    if not (torch.cuda.is_available() and mmv.has_cuda()):
        sys.exit("bench_skinny: needs a GPU and a CUDA build of torch_mm_variants")
    torch.manual_seed(0)
    ms = [int(m) for m in args.m.split(",")]
    shapes = [tuple(int(d) for d in s.lower().split("x")) for s in args.shapes.split(",")]
    print(f"# {args.algorithm} vs torch.mm on {torch.cuda.get_device_name()}, "
          f"torch {torch.__version__}; x [M, K] @ w.t(), w [N, K]")
    print("| dtype | M | N | K | torch.mm us | ours us | torch.mm GB/s | ours GB/s | speed-up |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    rows, ok = [], True
    for dtype_name in args.dtypes.split(","):
        dtype = DTYPES[dtype_name]
        for n, k in shapes:
            weight_bytes = n * k * dtype.itemsize
            weights = [torch.randn(n, k, device="cuda").to(dtype)
                       for _ in range(copies_needed(weight_bytes))]
            for m in ms:
                inputs = [(torch.randn(m, k, device="cuda").to(dtype), w) for w in weights]
                x, w = inputs[0]
                err = relative_error(mmv.matmul(x, w.t(), args.algorithm),
                                     x.double() @ w.double().t())
                if not err <= TOLERANCE[dtype]:
                    print(f"| {dtype_name} | {m} | {n} | {k} | WRONG: relative error {err:.1e} |")
                    ok = False
                    continue
                before = time_us(torch.mm, inputs)
                ours = time_us(lambda a, b: mmv.matmul(a, b, args.algorithm), inputs)
                after = time_us(torch.mm, inputs)
                baseline = (before + after) / 2
                row = {"dtype": dtype_name, "m": m, "n": n, "k": k, "torch_mm_us": baseline,
                       "us": ours, "torch_mm_gbs": weight_bytes / baseline / 1e3,
                       "gbs": weight_bytes / ours / 1e3, "speedup": baseline / ours,
                       "rel_error": err}
                rows.append(row)
                print(f"| {dtype_name} | {m} | {n} | {k} | {baseline:.1f} | {ours:.1f} "
                      f"| {row['torch_mm_gbs']:.0f} | {row['gbs']:.0f} | {row['speedup']:.2f}x |",
                      flush=True)
            del weights, inputs
    if args.output:
        with open(args.output, "w") as f:
            json.dump(rows, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
