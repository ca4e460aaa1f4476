"""End-to-end: a Llama-style decoder with its nn.Linear layers swapped for ours, beside the original.

    python -m torch_mm_variants.model_bench                    # GPU: bf16, Llama-8B-sized layers
    python -m torch_mm_variants.model_bench --device cpu --size tiny --no-compile

The model is built from plain torch modules with random weights (nothing is downloaded): token
embedding, blocks of RMSNorm -> grouped-query causal attention (q, k, v, o projections) ->
RMSNorm -> SiLU-gated MLP (gate, up, down), a final norm and the vocabulary projection. A copy
has every nn.Linear replaced by torch_mm_variants.Linear (same weights), and both are timed in
eager mode and under torch.compile(fullgraph=True), which fails loudly on any graph break:

- prefill: one forward pass over --prefill tokens;
- decode: a forward pass over a few new tokens (--decode, e.g. 1,8,16). Decode steps attend only
  to the new tokens (no KV cache): what they measure is the Linear layers at decode shapes, where
  M is the number of tokens in flight.

Before either model is timed at a step, both outputs are compared with a float64 copy of the
original model's: ours passes if its relative error (Frobenius norm) is at most twice the
original's plus the dtype's tolerance for one product (bench.TOLERANCE). A step that fails its
check, or where a model raises (checked or timed), is reported as FAILED with the error's first
line, and the run goes on; the exit status is then 1. Where the error left the CUDA context dead
(an illegal memory access), the run stops there, writes the rows measured so far, and exits with
status 1. Each row gives both step times, their ratio, both errors, and the largest difference
between the outputs.
"""
from __future__ import annotations

import argparse
import copy
import sys
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

import torch_mm_variants as mmv
from torch_mm_variants import bench

NAN = float("nan")


@dataclass
class Config:
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    layers: int
    vocab: int


SIZES = {
    "llama8b": Config(hidden=4096, intermediate=14336, heads=32, kv_heads=8, layers=4, vocab=32000),
    "small": Config(hidden=1024, intermediate=2816, heads=16, kv_heads=4, layers=2, vocab=8000),
    "tiny": Config(hidden=64, intermediate=176, heads=4, kv_heads=2, layers=2, vocab=256),
}


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        # In float32 at least: the float64 reference model stays float64 throughout.
        wide = x.to(torch.promote_types(x.dtype, torch.float32))
        scale = torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + self.eps)
        return (wide * scale).to(x.dtype) * self.weight


class Attention(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = c.heads, c.kv_heads, c.hidden // c.heads
        self.q_proj = nn.Linear(c.hidden, c.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(c.hidden, c.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(c.hidden, c.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(c.heads * self.head_dim, c.hidden, bias=False)

    def forward(self, x):
        batch, tokens, _ = x.shape
        q = self.q_proj(x).view(batch, tokens, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(batch, tokens, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(batch, tokens, self.kv_heads, self.head_dim).transpose(1, 2)
        repeat = self.heads // self.kv_heads
        k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(batch, tokens, -1))


class MLP(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden, c.intermediate, bias=False)
        self.up_proj = nn.Linear(c.hidden, c.intermediate, bias=False)
        self.down_proj = nn.Linear(c.intermediate, c.hidden, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.attn_norm, self.attn = RMSNorm(c.hidden), Attention(c)
        self.mlp_norm, self.mlp = RMSNorm(c.hidden), MLP(c)

    def forward(self, x):
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class Decoder(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.embed = nn.Embedding(c.vocab, c.hidden)
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.layers))
        self.norm = RMSNorm(c.hidden)
        self.lm_head = nn.Linear(c.hidden, c.vocab, bias=False)

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.norm(x))


def build_models(config: Config, device, dtype, algorithm: str):
    torch.manual_seed(0)
    original = Decoder(config).to(device=device, dtype=dtype).eval()
    for module in original.modules():  # small weights keep activations in range at any depth
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=module.in_features ** -0.5)
    swapped = mmv.swap_linear(copy.deepcopy(original), algorithm=algorithm)
    return original, swapped


def time_step(model, tokens, device, repeat: int) -> float:
    """Median milliseconds of one forward pass."""
    with torch.inference_mode():
        return bench.time_ms(lambda: model(tokens), device, repeat)


def largest_difference(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float]:
    """(max |a - b|, that over max |b|)."""
    diff = (a.float() - b.float()).abs().max().item()
    return diff, diff / max(b.float().abs().max().item(), 1e-30)


def compare(models, exact, tokens, tolerance: float) -> dict:
    """The check of one step: both models' outputs against the float64 model's. Ours passes
    if its relative error is at most twice the original's plus `tolerance`."""
    reference_model, our_model = models
    with torch.inference_mode():
        expected, ours = reference_model(tokens), our_model(tokens)
        exact_out = exact(tokens)
    diff, relative = largest_difference(ours, expected)
    original_err = bench.relative_error(expected, exact_out)
    err = bench.relative_error(ours, exact_out)
    return {"max_abs_diff": diff, "max_rel_diff": relative, "rel_error": err,
            "original_rel_error": original_err, "ok": err <= 2 * original_err + tolerance}


NOT_CHECKED = {"max_abs_diff": NAN, "max_rel_diff": NAN, "rel_error": NAN,
               "original_rel_error": NAN, "ok": False}


def time_beside(models, tokens, device, repeat: int) -> tuple[float, float, str | None]:
    """The original's time (the mean of its timings right before and after ours: heating and
    clock changes then affect both alike), ours, and None; or NaN, NaN and the first line of
    what one of the three timings raised, naming the model that raised it."""
    reference_model, our_model = models
    beside = bench.BesideTorchMm(lambda: time_step(reference_model, tokens, device, repeat),
                                 baseline="original model")
    ms, reference_ms, error = beside.time(lambda: time_step(our_model, tokens, device, repeat))
    return reference_ms, ms, error


def measure_step(models, exact, tokens, device, args, tolerance: float) -> dict:
    """One step's row less its labels: checked, then timed where the check passed (a wrong
    model is reported, never timed). A model that raises in either gives a failed row with the
    error's first line, so that the other steps are still measured and written."""
    checked, error = bench.attempt(lambda: compare(models, exact, tokens, tolerance))
    if error is not None:
        checked = NOT_CHECKED
    reference_ms = ms = NAN
    if checked["ok"]:
        reference_ms, ms, error = time_beside(models, tokens, device, args.repeat)
    return {"original_ms": reference_ms, "ours_ms": ms, "speedup": reference_ms / ms,
            **checked, "ok": checked["ok"] and error is None, "error": error}


def run(args) -> list[dict]:
    """Every step's row. bench.ContextLost, with the rows so far (the failed one last), where
    a model's error left the CUDA context dead: every later step would fail the same way."""
    device = bench.use_device(torch.device(args.device), "torch_mm_variants.model_bench")
    dtype = bench.DTYPES[args.dtype]
    config = SIZES[args.size]
    original, swapped = build_models(config, device, dtype, args.algorithm)
    exact = copy.deepcopy(original).double()  # the reference of every step's check
    tolerance = bench.tolerance_for(dtype, False)
    modes = [("eager", (original, swapped))]
    if args.compile:
        torch._dynamo.reset()
        modes.append(("compile", (torch.compile(original, fullgraph=True, dynamic=False),
                                  torch.compile(swapped, fullgraph=True, dynamic=False))))
    steps = [("prefill", args.prefill)] + [("decode", t) for t in args.decode]
    device_label = bench.device_name(device)  # in every row: the data names its GPU
    rows = []
    for mode, models in modes:
        for phase, tokens_in_flight in steps:
            bench.progress(f"{mode} {phase} {tokens_in_flight} tokens")
            tokens = torch.randint(0, config.vocab, (1, tokens_in_flight), device=device)
            row = measure_step(models, exact, tokens, device, args, tolerance)
            if row["error"]:
                print(f"\n{mode} {phase} {tokens_in_flight} tokens: FAILED: {row['error']}",
                      file=sys.stderr)
            rows.append({"device_name": device_label, "mode": mode, "phase": phase,
                         "tokens": tokens_in_flight, **row})
            bench.stop_if_context_lost(row["error"], rows)
    bench.progress("")
    return rows


def format_rows(rows: list[dict]) -> str:
    lines = ["| mode | phase | tokens | original ms | ours ms | ours vs original | max abs diff "
             "| rel. error (original's) |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        failed = f" FAILED ({r['error']})" if r["error"] else " FAILED"
        status = "" if r["ok"] else failed
        lines.append(f"| {r['mode']} | {r['phase']} | {r['tokens']} | {r['original_ms']:.3f} | "
                     f"{r['ours_ms']:.3f} | {r['speedup']:.2f}x | {r['max_abs_diff']:.2e} "
                     f"| {r['rel_error']:.1e} ({r['original_rel_error']:.1e}){status} |")
    return "\n".join(lines)


def parse_args(argv=None):
    gpu = torch.cuda.is_available() and mmv.has_cuda()
    p = argparse.ArgumentParser(prog="python -m torch_mm_variants.model_bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if gpu else "cpu")
    p.add_argument("--dtype", default="bfloat16" if gpu else "float32", choices=list(bench.DTYPES))
    p.add_argument("--size", default="llama8b" if gpu else "tiny", choices=list(SIZES))
    p.add_argument("--prefill", type=bench.positive_int, default=2048 if gpu else 64)
    p.add_argument("--decode", type=bench.positive_ints, default=[1, 8, 16],
                   help="comma-separated token counts of the decode steps")
    p.add_argument("--algorithm", default="auto", help="auto or one of the device's algorithms")
    p.add_argument("--repeat", type=bench.positive_int, default=10)
    p.add_argument("--no-compile", dest="compile", action="store_false",
                   help="eager mode only (torch.compile takes a while on a CPU)")
    p.add_argument("--output", default=None, help="write the rows as JSON")
    args = p.parse_args(argv)
    check_algorithm(p, args.algorithm, bench.parse_device(p, args.device))
    if args.output is not None:
        bench.check_writable(p, "--output", args.output, (".json",))
    return args


def check_algorithm(p: argparse.ArgumentParser, name: str, device: torch.device) -> None:
    """argparse's usage error, naming the valid ones, unless `device` has algorithm `name`:
    refused before the models are built rather than by the first swapped layer's call."""
    available = mmv.algorithms(device)
    if name != "auto" and name not in available:
        p.error(f"--algorithm {name!r}: not an algorithm of {device}; valid: "
                f"{', '.join(['auto'] + available)}")


def main(argv=None) -> int:
    args = parse_args(argv)
    start, lost = time.perf_counter(), None
    try:
        rows = run(args)
    except bench.ContextLost as error:  # the rows so far are reported and written
        rows, lost = error.rows, error
    name = rows[0]["device_name"]  # no CUDA call: the context may be dead
    print(f"# {args.size} decoder, {args.dtype}, on {name}: torch_mm_variants.Linear "
          f"(algorithm={args.algorithm}) vs nn.Linear ({time.perf_counter() - start:.0f} s)\n")
    print(format_rows(rows))
    if args.output:
        bench.write_json(rows, args.output)
    if lost:
        print(f"\ntorch_mm_variants.model_bench: {lost}", file=sys.stderr)
    return 0 if all(r["ok"] for r in rows) and not lost else 1


if __name__ == "__main__":
    sys.exit(main())
