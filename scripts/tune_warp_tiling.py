"""The tuning sweep behind the default tile configuration of the warp_tiling rung
(torch_mm_variants/csrc/cuda/07_warp_tiling.cu).

Builds the rung once per candidate configuration, each a small extension of its own (the rung's
source, the registry, and a binding that runs "warp_tiling" from that registry) with
MM_VARIANTS_WARP_TILING predefined through a pre-included header, builds them in parallel, then
checks each against a float64 reference and times it with triton.testing.do_bench (median) at
SIZE^3 float32, row-major A and B, beside torch.mm with TF32 off. The fastest configuration is the
default in 07_warp_tiling.cu.

    python3 scripts/tune_warp_tiling.py [--size 4096] [--jobs 8] [--build-only]
"""
from __future__ import annotations

import argparse
import os
import tempfile
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CSRC = os.path.join(ROOT, "torch_mm_variants", "csrc")

# (BM, BN, BK, WM, WN, TM, TN, MIN_BLOCKS): block tile, warp tile, thread tile, and the resident
# blocks per SM that __launch_bounds__ budgets registers for.
CANDIDATES = [
    (128, 128, 8, 64, 32, 8, 8, 2),
    (128, 128, 8, 32, 64, 8, 8, 2),
    (128, 128, 16, 64, 32, 8, 8, 2),
    (64, 128, 8, 32, 64, 8, 8, 4),
    (128, 64, 8, 64, 32, 8, 8, 4),
    (128, 128, 8, 64, 64, 8, 16, 2),
    (128, 256, 8, 64, 64, 8, 16, 1),
    (256, 128, 8, 64, 64, 16, 8, 1),
]

BINDING = r"""
#include <torch/extension.h>
#include "registry.h"

at::Tensor run(const at::Tensor& a, const at::Tensor& b) {
  at::Tensor out = at::empty({a.size(0), b.size(1)}, a.options());
  mm_variants::find_algorithm(a.device(), "warp_tiling").run(a, b, out);
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("run", &run); }
"""


def tag(config) -> str:
    bm, bn, bk, wm, wn, tm, tn, blocks = config
    return f"{bm}x{bn}x{bk}_w{wm}x{wn}_t{tm}x{tn}_b{blocks}"


def write_if_changed(path: str, text: str) -> str:
    """Writes `text` to `path` unless it is there already: a new mtime would make ninja rebuild."""
    if not os.path.exists(path) or open(path).read() != text:
        with open(path, "w") as f:
            f.write(text)
    return path


def build(config, root: str):
    """Builds (or finds built) the extension for one configuration and returns the module."""
    from torch.utils.cpp_extension import load

    name = f"mm_variants_wt_{tag(config)}"
    directory = os.path.join(root, name)
    os.makedirs(directory, exist_ok=True)
    header = write_if_changed(os.path.join(directory, "config.h"),
                              f"#define MM_VARIANTS_WARP_TILING {', '.join(map(str, config))}\n")
    binding = write_if_changed(os.path.join(directory, "binding.cpp"), BINDING)
    return load(name=name,
                sources=[os.path.join(CSRC, "cuda", "07_warp_tiling.cu"),
                         os.path.join(CSRC, "registry.cpp"), binding],
                extra_include_paths=[CSRC],
                extra_cflags=["-O3", "-std=c++17"],
                extra_cuda_cflags=["-O3", "-std=c++17", "--expt-relaxed-constexpr",
                                   "-include", header],
                build_directory=directory, verbose=False)


def build_only(config, root: str) -> str:
    build(config, root)
    return tag(config)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--jobs", type=int, default=min(len(CANDIDATES), os.cpu_count() or 1))
    parser.add_argument("--build-only", action="store_true",
                        help="build the candidates and stop (no GPU work: can overlap other runs)")
    parser.add_argument("--build-dir", default=os.path.join(tempfile.gettempdir(),
                                                            "mm_variants_tune_warp_tiling"))
    args = parser.parse_args()
    major, minor = torch.cuda.get_device_capability()
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", f"{major}.{minor}" + ("a" if major == 9 else ""))
    os.environ.setdefault("MAX_JOBS", "3")
    with ProcessPoolExecutor(args.jobs, mp_context=get_context("spawn")) as pool:
        for done in pool.map(build_only, CANDIDATES, [args.build_dir] * len(CANDIDATES)):
            print(f"built {done}", flush=True)
    if args.build_only:
        return

    from triton.testing import do_bench

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(0)
    n = args.size
    a, b = torch.randn(n, n, device="cuda"), torch.randn(n, n, device="cuda")
    ref = a.double() @ b.double()
    flop = 2.0 * n ** 3

    def bench(fn) -> float:
        return do_bench(lambda: fn(a, b), warmup=100, rep=500, return_mode="median")

    mm_ms = bench(torch.mm)
    rows = []
    for config in CANDIDATES:
        module = build(config, args.build_dir)
        err = ((module.run(a, b).double() - ref).norm() / ref.norm()).item()
        ms = bench(module.run) if err < 1e-5 else float("nan")
        rows.append((config, ms, err))
        print(f"timed {tag(config)}: {ms:.3f} ms", flush=True)
    mm_ms = (mm_ms + bench(torch.mm)) / 2

    print(f"\nwarp_tiling candidates at {n}^3 float32 on {torch.cuda.get_device_name()}"
          f" (torch.mm, TF32 off: {mm_ms:.3f} ms, {flop / mm_ms / 1e9:.1f} TFLOP/s)\n")
    print("| BM, BN, BK, WM, WN, TM, TN, MIN_BLOCKS | threads | ms | TFLOP/s | % of torch.mm "
          "| rel. error |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for config, ms, err in sorted(rows, key=lambda r: (r[1] != r[1], r[1])):
        bm, bn, _, wm, wn, *_ = config
        threads = bm // wm * (bn // wn) * 32
        print(f"| {', '.join(map(str, config))} | {threads} | {ms:.3f} | {flop / ms / 1e9:.1f} "
              f"| {100 * mm_ms / ms:.1f}% | {err:.1e} |")


if __name__ == "__main__":
    main()
