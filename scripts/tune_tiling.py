"""The tile sweeps behind the default configurations of the warp_tiling and tensor_core rungs
(torch_mm_variants/csrc/cuda/07_warp_tiling.cu, 08_tensor_core.cu).

Builds the rung once per candidate configuration, each a small extension of its own (the rung's
source, the registry, the epilogue's host side, and a binding that runs the rung from that
registry) with the rung's tiling macro predefined through a pre-included header, builds them in
parallel, then checks each against a float64 reference and times it with triton.testing.do_bench
(median) at SIZE^3, row-major A and B, beside torch.mm in the same process. The fastest
configuration is the rung's default.

    python3 scripts/tune_tiling.py --rung warp_tiling                 # float32, TF32 off
    python3 scripts/tune_tiling.py --rung tensor_core --dtype bfloat16 --sizes 4096,8192
    python3 scripts/tune_tiling.py --rung tensor_core --dtype float32  # TF32 on
    python3 scripts/tune_tiling.py ... --build-only                     # no GPU work
    python3 scripts/tune_tiling.py --rung tensor_core --candidates "128,256,128,64,64,3,1;..."
"""
from __future__ import annotations

import argparse
import os
import tempfile
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CSRC = os.path.join(ROOT, "torch_mm_variants", "csrc")


@dataclass(frozen=True)
class Rung:
    source: str
    macro: str
    fields: str  # the macro's parameters; the first five are always BM, BN, BK.., WM, WN
    candidates: tuple
    tf32: bool  # whether float32 inputs run in TF32 (then torch.mm gets TF32 too)


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
                        ), tf32=True),
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


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rung", choices=sorted(RUNGS), required=True)
    parser.add_argument("--dtype", choices=["float32", "float16", "bfloat16"], default=None,
                        help="float32 for warp_tiling, bfloat16 for tensor_core by default")
    parser.add_argument("--sizes", default="4096", help="comma-separated square sizes")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--build-only", action="store_true",
                        help="build the candidates and stop (no GPU work: can overlap other runs)")
    parser.add_argument("--candidates", default=None,
                        help="';'-separated configurations (the macro's fields, comma-separated) "
                             "instead of the rung's list")
    parser.add_argument("--build-dir", default=os.path.join(tempfile.gettempdir(),
                                                            "mm_variants_tune_tiling"))
    return parser.parse_args()


def time_candidates(rung_name: str, candidates, dtype: torch.dtype, n: int,
                    build_dir: str) -> None:
    from triton.testing import do_bench

    rung = RUNGS[rung_name]
    torch.manual_seed(0)
    a = torch.randn(n, n, device="cuda", dtype=dtype)
    b = torch.randn(n, n, device="cuda", dtype=dtype)
    ref = a.double() @ b.double()
    flop = 2.0 * n ** 3
    tolerance = 1e-5 if dtype == torch.float32 and not rung.tf32 else 1e-2

    def bench(fn) -> float:
        return do_bench(lambda: fn(a, b), warmup=100, rep=500, return_mode="median")

    rows = []
    for config in candidates:
        module = build(rung_name, config, build_dir)
        err = ((module.run(a, b).double() - ref).norm() / ref.norm()).item()
        mm_ms = bench(torch.mm)  # beside each candidate: heating affects both alike
        ms = bench(module.run) if err < tolerance else float("nan")
        rows.append((config, ms, mm_ms, err))
        print(f"timed {tag(config)}: {ms:.3f} ms (torch.mm {mm_ms:.3f} ms)", flush=True)

    tf32 = " (TF32)" if dtype == torch.float32 and rung.tf32 else ""
    print(f"\n{rung_name} candidates at {n}^3 {str(dtype)[6:]}{tf32} on "
          f"{torch.cuda.get_device_name()}, torch.mm timed beside each\n")
    print(f"| {rung.fields} | threads | ms | TFLOP/s | % of torch.mm | rel. error |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for config, ms, mm_ms, err in sorted(rows, key=lambda r: (r[1] != r[1], r[1])):
        bm, bn, _, wm, wn, *_ = config
        threads = bm // wm * (bn // wn) * 32
        print(f"| {', '.join(map(str, config))} | {threads} | {ms:.3f} | {flop / ms / 1e9:.1f} "
              f"| {100 * mm_ms / ms:.1f}% | {err:.1e} |")


def main() -> None:
    args = parse_args()
    rung = RUNGS[args.rung]
    candidates = rung.candidates
    if args.candidates:
        candidates = tuple(tuple(int(x) for x in c.split(",")) for c in args.candidates.split(";"))
    major, minor = torch.cuda.get_device_capability()
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", f"{major}.{minor}" + ("a" if major == 9 else ""))
    os.environ.setdefault("MAX_JOBS", "2")
    count = len(candidates)
    with ProcessPoolExecutor(min(args.jobs, count), mp_context=get_context("spawn")) as pool:
        for done in pool.map(build_only, [args.rung] * count, candidates,
                             [args.build_dir] * count):
            print(f"built {done}", flush=True)
    if args.build_only:
        return
    dtype = getattr(torch, args.dtype or ("bfloat16" if rung.tf32 else "float32"))
    torch.backends.cuda.matmul.allow_tf32 = rung.tf32
    for n in map(int, args.sizes.split(",")):
        time_candidates(args.rung, candidates, dtype, n, args.build_dir)


if __name__ == "__main__":
    main()
