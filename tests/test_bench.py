"""The benchmark runs every registered algorithm, checks it and writes its rows."""
from __future__ import annotations

import csv
import importlib.util
import json
import math
import pathlib
import subprocess
import sys

import pytest
import torch

import torch_mm_variants as mmv
from conftest import failing_while_timed
from torch_mm_variants import bench


def test_bench_cpu_writes_rows(tmp_path, capsys):
    out = tmp_path / "rows.json"
    assert bench.main(["--device", "cpu", "--sizes", "33,20x9x70", "--repeat", "3",
                       "--output", str(out)]) == 0
    rows = json.loads(out.read_text())
    names = {r["algorithm"] for r in rows}
    assert set(mmv.algorithms("cpu")) <= names and "torch.mm" in names
    assert any(n.startswith("auto (") for n in names)
    assert all(r["ok"] and r["ms"] > 0 and r["gflops"] > 0 for r in rows)
    assert {(r["m"], r["n"], r["k"]) for r in rows} == {(33, 33, 33), (20, 9, 70)}
    # The data names the machine, as the printed table's title does.
    assert {r["device_name"] for r in rows} == {bench.device_name(torch.device("cpu"))}
    table = capsys.readouterr().out
    assert "| algorithm | ms | GFLOP/s | % of torch.mm |" in table and "CPU" in table


def test_bench_csv_and_algorithm_subset(tmp_path):
    out = tmp_path / "rows.csv"
    assert bench.main(["--device", "cpu", "--sizes", "16", "--algorithms", "naive,parallel",
                       "--dtype", "bfloat16", "--output", str(out)]) == 0
    with open(out) as f:
        rows = list(csv.DictReader(f))
    assert [r["algorithm"] for r in rows] == ["naive", "parallel", "torch.mm"]
    assert all(r["dtype"] == "bfloat16" for r in rows)
    assert all(r["device_name"].startswith("CPU (") for r in rows)


@pytest.mark.parametrize("weight_layout", [False, True])
def test_bench_a_transposed_times_that_layout(weight_layout, tmp_path, capsys, monkeypatch):
    """--a-transposed hands every algorithm and torch.mm a = x.t() for an x [K, M] (with
    --weight-layout also b = w.t()), names it in the table's title, and checks every result."""
    layouts = set()
    product = mmv.matmul

    def matmul(a, b, algorithm="auto"):
        layouts.add((a.stride(0) == 1 and a.stride(1) == a.size(0),
                     b.stride(0) == 1 and b.stride(1) == b.size(0)))
        return product(a, b, algorithm)
    monkeypatch.setattr(mmv, "matmul", matmul)
    out = tmp_path / "rows.json"
    argv = ["--device", "cpu", "--sizes", "20x9x70", "--algorithms", "naive,parallel",
            "--repeat", "2", "--a-transposed", "--output", str(out)]
    assert bench.main(argv + (["--weight-layout"] if weight_layout else [])) == 0
    assert layouts == {(True, weight_layout)}
    rows = json.loads(out.read_text())
    assert [r["algorithm"] for r in rows] == ["naive", "parallel", "torch.mm"]
    assert all(r["ok"] and r["ms"] > 0 for r in rows)
    # Each row names the layouts (and TF32, off on the CPU), which the heading says too.
    assert {(r["a_transposed"], r["weight_layout"], r["tf32"]) for r in rows} == \
        {(True, weight_layout, False)}
    b_form = "b = w.t(), w [9, 70]" if weight_layout else "b [70, 9]"
    assert f"## 20x9x70 (M x N x K, a = x.t(), x [70, 20], {b_form})" in capsys.readouterr().out


def raising_on(name):
    """mmv.matmul, but raising as a kernel's TORCH_CHECK does for `name` (a message with the C++
    frames on the lines below its first)."""
    product = mmv.matmul

    def matmul(a, b, algorithm="auto"):
        if algorithm == name:
            raise RuntimeError(f"{name}: no kernel for these strides\nException raised from f()")
        return product(a, b, algorithm)
    return matmul


def test_a_raising_kernel_fails_its_rows_and_the_run_goes_on(tmp_path, monkeypatch, capsys):
    """A kernel that raises where algorithm_accepts took the inputs is reported as failed with
    the error's message, not timed; the other rows of every size are measured and written, and
    the exit status is 1."""
    monkeypatch.setattr(mmv, "matmul", raising_on("naive"))
    timed = []
    time_ms = bench.time_ms
    monkeypatch.setattr(bench, "time_ms", lambda step, device, repeat: timed.append(step)
                        or time_ms(step, device, repeat))
    out = tmp_path / "rows.json"
    assert bench.main(["--device", "cpu", "--sizes", "16,8x24x40", "--algorithms",
                       "naive,parallel", "--repeat", "3", "--output", str(out)]) == 1
    rows = json.loads(out.read_text())
    assert [(r["m"], r["algorithm"], r["ok"]) for r in rows] == [
        (16, "naive", False), (16, "parallel", True), (16, "torch.mm", True),
        (8, "naive", False), (8, "parallel", True), (8, "torch.mm", True)]
    message = "RuntimeError: naive: no kernel for these strides"
    assert [r["error"] for r in rows] == [message, None, None] * 2
    assert len(timed) == 2 * 3  # torch.mm, parallel, torch.mm at each size: naive never
    captured = capsys.readouterr()
    assert captured.out.count(f"FAILED ({message})") == 2
    assert f"naive at 8x24x40: FAILED: {message}" in captured.err


def strict_json(text):
    """JSON as strict parsers read it: NaN and Infinity are not JSON."""
    def refuse(constant):
        raise ValueError(f"{constant} is not JSON")
    return json.loads(text, parse_constant=refuse)


def test_rows_not_timed_are_written_as_null_in_json(tmp_path, monkeypatch):
    """A row that fails its check has no time: its ms is null in the JSON (which has no NaN,
    and whose strict parsers reject Python's), its rates 0."""
    product = mmv.matmul
    monkeypatch.setattr(mmv, "matmul",
                        lambda a, b, algorithm="auto": 2 * product(a, b, algorithm))
    out = tmp_path / "rows.json"
    assert bench.main(["--device", "cpu", "--sizes", "16", "--algorithms", "naive",
                       "--output", str(out)]) == 1
    rows = strict_json(out.read_text())
    wrong, baseline = rows
    assert (wrong["algorithm"], wrong["ok"], wrong["ms"], wrong["gflops"],
            wrong["pct_of_torch_mm"]) == ("naive", False, None, None, None)
    assert abs(wrong["rel_error"] - 1) < 1e-6 and baseline["ms"] > 0


def test_every_input_set_is_checked_and_the_worst_error_reported(tmp_path, monkeypatch):
    """With several input sets cycled (past the GPU's L2), each set's product is checked before
    timing, not the first only: a kernel wrong on the third set alone fails, with that set's
    relative error, and is not timed."""
    monkeypatch.setattr(bench, "input_sets_needed", lambda *args: 3)
    product, scales = mmv.matmul, iter([1.0, 1.5, 3.0])  # relative errors 0, 0.5 and 2
    monkeypatch.setattr(mmv, "matmul", lambda a, b, algorithm="auto":
                        next(scales) * product(a, b, algorithm))
    monkeypatch.setattr(bench, "time_ms", lambda step, device, repeat: 1.0)
    out = tmp_path / "rows.json"
    assert bench.main(["--device", "cpu", "--sizes", "16", "--algorithms", "naive",
                       "--output", str(out)]) == 1
    wrong, baseline = json.loads(out.read_text())
    assert (wrong["algorithm"], wrong["ok"], wrong["ms"]) == ("naive", False, None)
    assert abs(wrong["rel_error"] - 2) < 1e-6
    assert next(scales, "none left") == "none left"  # three checked calls, none timed
    assert baseline["ok"] and baseline["rel_error"] < 1e-6 and baseline["ms"] == 1.0


def test_beside_torch_mm_compares_with_its_neighbours_and_gives_their_median():
    """BesideTorchMm times torch.mm right before and after each algorithm and gives the mean of
    those two for it; torch.mm's own time is the median of all its timings, in whatever unit
    the timing callables use."""
    torch_mm_times, calls = iter([1.0, 3.0, 10.0, 20.0, 30.0, 40.0]), []

    def time_torch_mm():
        calls.append("torch.mm")
        return next(torch_mm_times)

    def algorithm(value):
        return lambda: calls.append("algorithm") or value

    beside = bench.BesideTorchMm(time_torch_mm)
    assert beside.time(algorithm(2.5)) == (2.5, 2.0, None)
    assert beside.time(algorithm(7.0)) == (7.0, 15.0, None)
    assert beside.time(algorithm(0.5)) == (0.5, 35.0, None)
    assert calls == ["torch.mm", "algorithm", "torch.mm"] * 3
    assert beside.torch_mm_time() == (15.0, None)  # the median of 1, 3, 10, 20, 30 and 40
    assert len(calls) == 9  # from the timings taken: no more of torch.mm


def test_beside_torch_mm_times_torch_mm_once_where_nothing_else_was_timed():
    calls = []
    beside = bench.BesideTorchMm(lambda: calls.append("torch.mm") or 4.0)
    assert beside.torch_mm_time() == (4.0, None) and calls == ["torch.mm"]


def test_beside_torch_mm_gives_a_timing_that_raised_as_its_error():
    """A timing that raises (a CUDA error, do_bench failing) gives NaN times and the error's
    first line, naming torch.mm where its timing beside the algorithm raised, and adds nothing
    to torch.mm's median."""
    def raising(message):
        def fn():
            raise RuntimeError(f"{message}\nException raised from launch()")
        return fn

    beside = bench.BesideTorchMm(lambda: 1.0)
    ms, torch_mm_ms, error = beside.time(raising("CUDA error: unspecified launch failure"))
    assert math.isnan(ms) and math.isnan(torch_mm_ms)
    assert error == "RuntimeError: CUDA error: unspecified launch failure"
    assert beside.time(lambda: 2.0) == (2.0, 1.0, None)
    assert beside.torch_mm_time() == (1.0, None)
    broken = bench.BesideTorchMm(raising("do_bench: no events"))
    assert broken.time(lambda: 2.0)[2] == "torch.mm beside it: RuntimeError: do_bench: no events"
    ms, error = broken.torch_mm_time()  # nothing timed, and its own timing raises
    assert math.isnan(ms) and error == "RuntimeError: do_bench: no events"


@pytest.mark.parametrize("dies", [False, True], ids=["context alive", "context dead"])
def test_a_kernel_raising_while_timed_fails_its_row(dies, tmp_path, monkeypatch, capsys,
                                                     dying_cuda_context):
    """A kernel that passes its check and raises while timed gets a failed row with the error's
    first line, and the run goes on to the other rows and sizes; but where the error left the
    CUDA context dead, the run stops there: the rows so far, the failed one last, are written,
    and the exit status is 1 with a message that says why."""
    message = "CUDA error: an illegal memory access was encountered"
    failing_while_timed(monkeypatch, "naive", message, dying_cuda_context if dies else None)
    out = tmp_path / "rows.json"
    assert bench.main(["--device", "cpu", "--sizes", "16,8x24x40", "--algorithms",
                       "parallel,naive,tiled", "--repeat", "3", "--output", str(out)]) == 1
    rows = json.loads(out.read_text())
    measured = [(16, "parallel", True), (16, "naive", False)]
    if not dies:
        measured += [(16, "tiled", True), (16, "torch.mm", True), (8, "parallel", True),
                     (8, "naive", False), (8, "tiled", True), (8, "torch.mm", True)]
    assert [(r["m"], r["algorithm"], r["ok"]) for r in rows] == measured
    failed = rows[1]
    assert failed["error"] == f"RuntimeError: {message}" and failed["ms"] is None
    assert failed["rel_error"] < 1e-6  # it passed its check
    captured = capsys.readouterr()
    assert f"naive at 16x16x16: FAILED: RuntimeError: {message}" in captured.err
    assert f"FAILED (RuntimeError: {message})" in captured.out  # in the table too
    lost = f"torch_mm_variants.bench: the CUDA context is lost (RuntimeError: {message})"
    assert (lost in captured.err) == dies


def test_a_kernel_killing_the_context_in_its_check_stops_the_run(tmp_path, monkeypatch, capsys,
                                                                  dying_cuda_context):
    """A dead CUDA context stops the run where the check raised, too: every later check and
    timing would fail the same way."""
    raising = raising_on("naive")
    monkeypatch.setattr(mmv, "matmul", lambda a, b, algorithm="auto": (
        dying_cuda_context.append(algorithm) if algorithm == "naive" else None)
        or raising(a, b, algorithm))
    out = tmp_path / "rows.json"
    assert bench.main(["--device", "cpu", "--sizes", "16,24", "--algorithms", "parallel,naive",
                       "--repeat", "3", "--output", str(out)]) == 1
    rows = json.loads(out.read_text())
    assert [(r["m"], r["algorithm"], r["ok"]) for r in rows] == [(16, "parallel", True),
                                                                 (16, "naive", False)]
    assert "the CUDA context is lost" in capsys.readouterr().err


def test_parse_size():
    assert bench.parse_size("64") == (64, 64, 64)
    assert bench.parse_size("1x4096x14336") == (1, 4096, 14336)


@pytest.mark.parametrize("sizes", ["16x8", "abc", "0", "4x-2x3"])
def test_bad_sizes_get_a_usage_error(sizes, capsys):
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--device", "cpu", "--sizes", sizes])
    assert exit_info.value.code == 2  # argparse's usage error, not a traceback
    assert "--sizes" in capsys.readouterr().err


def test_bench_rounds_summarize_the_spread(tmp_path, capsys):
    out = tmp_path / "rows.json"
    assert bench.main(["--device", "cpu", "--sizes", "24", "--algorithms", "naive,parallel",
                       "--repeat", "3", "--rounds", "2", "--output", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert sorted((r["algorithm"], r["round"]) for r in rows) == [
        ("naive", 1), ("naive", 2), ("parallel", 1), ("parallel", 2), ("torch.mm", 1),
        ("torch.mm", 2)]
    printed = capsys.readouterr().out
    assert "round 2 of 2" in printed and "## Across 2 rounds" in printed
    spread = printed.split("## Across 2 rounds")[1]
    for name in ("naive", "parallel"):
        row = next(line for line in spread.splitlines() if f"| {name} |" in line)
        low, high = (float(x) for x in row.split("|")[5].strip().rstrip("%").split("-"))
        pcts = [r["pct_of_torch_mm"] for r in rows if r["algorithm"] == name]
        assert (low, high) == (round(min(pcts), 1), round(max(pcts), 1))
        assert row.split("|")[3].strip() == "2"


@pytest.mark.parametrize("option", [
    ["--device", "bogus"],
    ["--output", "{tmp}/missing/rows.json"],
    ["--output", "{tmp}"],  # a directory
    ["--output", ""],
    ["--output", "{tmp}/rows.txt"],  # the format follows the name: .json or .csv
    ["--repeat", "0"],
    ["--rounds", "-1"],
    ["--algorithms", "bogus"],
    ["--algorithms", "naive,,tiled"],
    ["--algorithms", ""],  # not every algorithm
    ["--algorithms", "naive,naive"],  # its rows would count as two rounds
    ["--sizes", "8,8x8x8"],
    ["--output", "{tmp}/dangling.json"],  # a link to a folder that does not exist
    pytest.param(["--device", "cuda"], marks=pytest.mark.skipif(
        torch.cuda.is_available(), reason="a GPU is visible")),
    pytest.param(["--device", "cuda:{gpus}"], marks=pytest.mark.skipif(
        not torch.cuda.is_available(), reason="needs a GPU")),
])
def test_bad_values_get_a_usage_error_before_the_run(option, tmp_path, capsys, monkeypatch):
    """Each is refused by argparse, naming the option, before anything is measured: not with a
    traceback at the start or end of the run, nor a run with a meaningless value."""
    (tmp_path / "dangling.json").symlink_to(tmp_path / "missing" / "rows.json")
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    option = [arg.format(tmp=tmp_path, gpus=gpus) for arg in option]
    monkeypatch.setattr(bench, "bench_size", lambda *args: pytest.fail("the run started"))
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--sizes", "8", *option])  # a later --sizes replaces the first
    assert exit_info.value.code == 2
    assert option[0] in capsys.readouterr().err


def test_tf32_on_the_cpu_gets_a_usage_error(monkeypatch, capsys):
    """The CPU has no TF32: --tf32 there would only loosen the float32 check to TF32's
    tolerance (5e-3), passing a CPU kernel 500 times less accurate than float32's 1e-5."""
    monkeypatch.setattr(bench, "bench_size", lambda *args: pytest.fail("the run started"))
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--device", "cpu", "--sizes", "8", "--tf32"])
    assert exit_info.value.code == 2
    assert "--tf32" in capsys.readouterr().err


def test_bench_script_keeps_the_callers_directory(tmp_path):
    """scripts/bench, run from elsewhere, writes a relative --output where it was run."""
    script = pathlib.Path(__file__).resolve().parent.parent / "scripts" / "bench"
    result = subprocess.run(["bash", str(script), "--device", "cpu", "--sizes", "8",
                             "--algorithms", "naive", "--output", "rows.json"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    rows = json.loads((tmp_path / "rows.json").read_text())
    assert [r["algorithm"] for r in rows] == ["naive", "torch.mm"] and all(r["ok"] for r in rows)


@pytest.mark.parametrize("mnk,dtype", [((256, 256, 256), torch.float32),
                                       ((512, 512, 512), torch.float32),
                                       ((1024, 1024, 1024), torch.bfloat16),
                                       ((2048, 2048, 2048), torch.bfloat16),
                                       ((64, 4096, 4096), torch.bfloat16),
                                       ((4096, 4096, 4096), torch.float32)])
def test_input_rotation_outgrows_an_h100_l2(mnk, dtype, monkeypatch):
    """The input sets cycled on the GPU read at least twice L2's bytes (50 MB on an H100), so
    that no call finds its operands in L2 from an earlier call."""
    l2_bytes = 50 * 2**20
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda device: type("Properties", (), {"L2_cache_size": l2_bytes}))
    m, n, k = mnk
    sets = bench.input_sets_needed(m, n, k, dtype, torch.device("cuda"))
    operand_bytes = (m * k + k * n) * dtype.itemsize  # what a call reads
    assert sets * operand_bytes >= 2 * l2_bytes
    assert sets == 1 or (sets - 1) * operand_bytes < 4 * l2_bytes  # and not many more
    assert bench.input_sets_needed(1, 1, 1, dtype, torch.device("cuda")) == 1024  # bounded


SCRIPTS = pathlib.Path(__file__).resolve().parent.parent / "scripts"


def load_script(name):
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # where a dataclass looks up its module's annotations
    spec.loader.exec_module(module)
    return module


def load_bench_skinny():
    return load_script("bench_skinny")


def test_bench_skinny_times_torch_mm_beside_each_algorithm_and_skips_refusals(monkeypatch):
    """scripts/bench_skinny.py's measurement at one shape (run here on CPU tensors and kernels
    with a clock that rises at every measurement): an algorithm that does not take the inputs is
    skipped with its reason rather than raising; torch.mm is timed right before and after each
    algorithm, which is compared with the mean of the two."""
    skinny = load_bench_skinny()
    accepts = mmv._C.algorithm_accepts
    monkeypatch.setattr(mmv._C, "algorithm_accepts", lambda name, a, b: (
        (False, "takes M <= 64") if name == "tiled" else accepts(name, a, b)))
    timed = []

    def time_us(fn, inputs):
        x, w = inputs[len(timed) % len(inputs)]
        fn(x, w.t())
        timed.append("torch.mm" if fn is torch.mm else "ours")
        return float(len(timed))

    inputs = [(torch.randn(5, 40), torch.randn(24, 40)) for _ in range(2)]
    results, baseline = skinny.measure(inputs, ["naive", "tiled", "parallel"], time_us, 1e-5)
    assert timed == ["torch.mm", "ours", "torch.mm"] * 2
    assert [r["algorithm"] for r in results] == ["naive", "tiled", "parallel"]
    assert results[1] == {"algorithm": "tiled", "skipped": "takes M <= 64"}
    assert [(r["us"], r["torch_mm_us"], r["ok"]) for r in results[::2]] == [(2, 2, True),
                                                                           (5, 5, True)]
    assert baseline == 3.5  # the median of 1, 3, 4 and 6


@pytest.mark.parametrize("layout", ["linear", "row-major"])
def test_bench_skinny_weight_layouts(layout):
    """--weight: the benchmark multiplies x @ w.t(), where w.t() is nn.Linear's K-contiguous
    view of a weight [N, K] or, for row-major, a weight stored [K, N] row by row."""
    skinny = load_bench_skinny()
    assert skinny.parse_args(["--weight", layout]).weight == layout
    w = skinny.weight_copy(24, 40, torch.float32, layout, device="cpu")
    assert w.shape == (24, 40) and w.dtype == torch.float32
    b = w.t()
    assert b.stride() == ((1, 40) if layout == "linear" else (24, 1))


@pytest.mark.parametrize("layout", ["linear", "row-major"])
def test_bench_skinny_batch_gives_each_entry_its_own_weight(layout):
    """--batch B: B weights [N, K] (or [K, N] stored row by row), read as w.mT, one per entry of
    x [B, M, K]."""
    skinny = load_bench_skinny()
    assert skinny.parse_args(["--batch", "3"]).batch == 3
    assert skinny.parse_args([]).batch is None
    w = skinny.weight_copy(24, 40, torch.float32, layout, device="cpu", batch=3)
    assert w.shape == (3, 24, 40)
    assert w.mT.stride() == ((960, 1, 40) if layout == "linear" else (960, 24, 1))


def test_bench_skinny_batch_times_torch_bmm_beside_each_algorithm(monkeypatch):
    """With a batch, measure checks every entry's product against float64, asks whether an
    algorithm takes one entry, and times torch.bmm (the baseline given) beside each algorithm."""
    skinny = load_bench_skinny()
    asked, timed = [], []
    accepts = mmv._C.algorithm_accepts

    def accepts_entry(name, a, b):
        asked.append((a.dim(), b.dim()))
        return accepts(name, a, b)

    monkeypatch.setattr(mmv._C, "algorithm_accepts", accepts_entry)

    def time_us(fn, inputs):
        x, w = inputs[0]
        assert fn(x, w.mT).shape == (3, 5, 24)
        timed.append("torch.bmm" if fn is torch.bmm else "ours")
        return float(len(timed))

    inputs = [(torch.randn(3, 5, 40), skinny.weight_copy(24, 40, torch.float32, "row-major",
                                                         device="cpu", batch=3))
              for _ in range(2)]
    results, baseline = skinny.measure(inputs, ["naive", "parallel"], time_us, 1e-5, torch.bmm)
    assert asked == [(2, 2), (2, 2)]
    assert timed == ["torch.bmm", "ours", "torch.bmm"] * 2
    assert [r["ok"] for r in results] == [True, True] and baseline == 3.5


def test_bench_skinny_batch_rows_and_header(tmp_path, monkeypatch, capsys):
    """main with --batch: the table has a B column and names torch.bmm, and each row carries B
    and the weight bytes of every entry (CPU tensors standing in for the GPU's)."""
    skinny = load_bench_skinny()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Fake GPU")
    monkeypatch.setattr(mmv, "has_cuda", lambda: True)
    monkeypatch.setattr(skinny, "copies_needed", lambda weight_bytes: 2)
    randn = torch.randn
    monkeypatch.setattr(skinny.torch, "randn", lambda *size, device=None: randn(*size))
    monkeypatch.setattr(skinny, "flush_us", lambda fn, inputs: (fn(inputs[0][0], inputs[0][1].mT),
                                                             2.0)[1])
    out = tmp_path / "rows.json"
    assert skinny.main(["--batch", "4", "--m", "2", "--shapes", "24x40", "--dtypes", "float32",
                        "--algorithms", "parallel", "--output", str(out)]) == 0
    row, baseline = json.loads(out.read_text())
    assert (row["batch"], row["m"], row["n"], row["k"], row["ok"]) == (4, 2, 24, 40, True)
    assert row["gbs"] == 4 * 24 * 40 * 4 / 2.0 / 1e3
    assert (baseline["algorithm"], baseline["us"], baseline["gbs"]) == ("torch.bmm", 2.0,
                                                                        row["gbs"])
    printed = capsys.readouterr().out
    assert "vs torch.bmm" in printed and "| B | dtype | M | N | K | torch.bmm us |" in printed
    assert "| 4 | float32 | 2 | 24 | 40 | 2.0 |" in printed


def test_bench_skinny_eager_timing_rotates_the_weights_and_waits_for_the_gpu(monkeypatch):
    """--timing eager: the calls rotate over the weight copies, each timed repeat starts from an
    idle GPU and ends when its work is done, and the time is per call (CPU tensors here, the
    clock and the synchronizations counted)."""
    skinny = load_bench_skinny()
    events, clock = [], iter(range(0, 10 ** 6, 96))  # each repeat's 48 calls take 96 "seconds"
    monkeypatch.setattr(skinny.torch.cuda, "synchronize", lambda: events.append("sync"))
    monkeypatch.setattr(skinny.time, "perf_counter", lambda: next(clock))
    inputs = [(torch.randn(2, 8), torch.randn(3, 8)) for _ in range(3)]

    def fn(x, w_t):
        events.append(next(i for i, (_, w) in enumerate(inputs) if w_t._base is w))

    assert skinny.eager_us(fn, inputs, calls=48, repeats=4) == 2e6  # 96 s / 48 calls, in us
    assert events[:3] == [0, 1, 2]  # the untimed first calls
    repeat = ["sync"] + [i % 3 for i in range(48)] + ["sync"]
    assert events[3:] == repeat * 4


def test_bench_skinny_reports_a_raising_kernel_and_goes_on(monkeypatch):
    """scripts/bench_skinny.py: an algorithm that raises where algorithm_accepts took the inputs
    gives a failed result with the error's message, is not timed, and the next is measured."""
    skinny = load_bench_skinny()
    monkeypatch.setattr(mmv, "matmul", raising_on("naive"))
    timed = []

    def time_us(fn, inputs):
        timed.append(fn)
        return 1.0

    inputs = [(torch.randn(5, 40), torch.randn(24, 40))]
    results, baseline = skinny.measure(inputs, ["naive", "parallel"], time_us, 1e-5)
    assert results[0]["error"] == "RuntimeError: naive: no kernel for these strides"
    assert results[0]["ok"] is False and math.isnan(results[0]["us"])
    assert (results[1]["ok"], results[1]["error"]) == (True, None)
    assert len(timed) == 3 and baseline == 1.0  # parallel, between two of torch.mm


def test_tune_tiling_help_runs_without_a_gpu():
    result = subprocess.run(["python3", str(SCRIPTS / "tune_tiling.py"), "--help"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "--output" in result.stdout and "--candidates" in result.stdout


def test_tune_tiling_parses_candidates_against_the_rungs_fields():
    tune = load_script("tune_tiling")
    assert tune.parse_args(["--rung", "warp_tiling"]).candidates == \
        tune.RUNGS["warp_tiling"].candidates
    args = tune.parse_args(["--rung", "tensor_core", "--candidates",
                            "128,256,128,64,64,3,1;128,128,128,64,64,2,2"])
    assert args.candidates == ((128, 256, 128, 64, 64, 3, 1), (128, 128, 128, 64, 64, 2, 2))


@pytest.mark.parametrize("option", [["--candidates", "128,256,128,64,64,3"],
                                    ["--candidates", "128,256;x"],
                                    ["--candidates", ""],
                                    ["--candidates", "128,256,128,0,64,3,1"],
                                    ["--candidates", "128,256,128,48,64,3,1"],  # 48 in 128?
                                    ["--candidates", "128,128,128,64,64,2,2;128,128,128,64,64,2,2"],
                                    ["--output", "{missing}/rows.json"],
                                    ["--output", "rows.csv"]])  # it writes JSON
def test_tune_tiling_bad_candidates_or_output_get_a_usage_error(option, tmp_path, capsys):
    """A configuration with the wrong number of fields, not made of integers, with a field
    below 1 or a warp tile that does not divide the block, given twice, or none at all, and an
    output in a directory that does not exist or not named .json, are refused by argparse before
    anything is built."""
    tune = load_script("tune_tiling")
    option = [arg.format(missing=tmp_path / "missing") for arg in option]
    with pytest.raises(SystemExit) as exit_info:
        tune.parse_args(["--rung", "tensor_core", *option])
    assert exit_info.value.code == 2
    assert option[0] in capsys.readouterr().err


def test_tune_tiling_times_torch_mm_beside_each_candidate():
    """scripts/tune_tiling.py's measurement (run here on CPU tensors, candidates standing in for
    the built extensions, and a clock that rises at every timing): each candidate is checked,
    then timed between two timings of torch.mm and compared with their mean; a wrong one is not
    timed; the rows carry the device's name and the configuration by field."""
    tune = load_script("tune_tiling")
    wrong = (128, 128, 8, 64, 32, 8, 8, 2)
    candidates = ((64, 128, 8, 32, 64, 8, 8, 4), wrong, (128, 64, 8, 64, 32, 8, 8, 4))
    timed = []

    def run_of(config):
        return lambda a, b: (2 if config == wrong else 1) * torch.mm(a, b)

    def time_ms(fn):
        timed.append("torch.mm" if fn is torch.mm else "candidate")
        return float(len(timed))

    a, b = torch.randn(16, 16), torch.randn(16, 16)
    rows, mm_ms = tune.measure("warp_tiling", candidates, a, b, run_of, time_ms, tf32=False)
    assert timed == ["torch.mm", "candidate", "torch.mm"] * 2
    assert [(r["ms"], r["torch_mm_ms"], r["ok"]) for r in rows[::2]] == [(2, 2, True),
                                                                         (5, 5, True)]
    assert not rows[1]["ok"] and math.isnan(rows[1]["ms"]) and rows[1]["rel_error"] > 0.5
    assert mm_ms == 3.5  # the median of 1, 3, 4 and 6
    assert rows[0]["config"] == {"BM": 64, "BN": 128, "BK": 8, "WM": 32, "WN": 64, "TM": 8,
                                 "TN": 8, "MIN_BLOCKS": 4}
    assert rows[0]["threads"] == 2 * 2 * 32 and rows[0]["size"] == 16
    assert {r["device_name"] for r in rows} == {bench.device_name(torch.device("cpu"))}


def test_tune_tiling_does_not_time_a_candidate_that_would_not_run():
    """A tensor_core candidate whose stages need more shared memory than a block may have would
    run another tiling under its name: its row fails with the bytes, untimed, with its rates
    null rather than 0, and the others are timed."""
    tune = load_script("tune_tiling")
    fits, too_big = (128, 128, 128, 64, 64, 2, 2), (128, 256, 128, 64, 64, 4, 1)
    assert tune.tensor_core_smem_bytes(fits) == 65536
    assert tune.tensor_core_smem_bytes(too_big) == 196608
    timed = []

    def time_ms(fn):
        timed.append(fn)
        return 1.0

    a, b = torch.randn(16, 16, dtype=torch.bfloat16), torch.randn(16, 16, dtype=torch.bfloat16)
    rows, _ = tune.measure("tensor_core", (too_big, fits), a, b,
                           lambda config: torch.mm, time_ms, tf32=False, smem_limit=101376)
    assert not rows[0]["ok"] and "needs 196608 bytes" in rows[0]["error"]
    assert math.isnan(rows[0]["tflops"]) and math.isnan(rows[0]["pct_of_torch_mm"])
    assert rows[1]["ok"] and rows[1]["tflops"] > 0 and len(timed) == 3


def test_bench_skinny_rotation_reads_every_copy():
    """The graph and eager timings call at least once per weight copy: 48 calls over 150
    copies left 102 unread, and L2 could hold the 48 read."""
    skinny = load_bench_skinny()
    assert skinny.rotation(list(range(150)), 48) == list(range(150))
    assert skinny.rotation([0, 1, 2], 7) == [0, 1, 2, 0, 1, 2, 0]


def test_bench_skinny_a_timing_that_raises_fails_its_result_and_goes_on(monkeypatch):
    """scripts/bench_skinny.py: an algorithm that passes its check and raises while timed gives
    a failed result with the error's first line, and the next algorithm is measured."""
    skinny = load_bench_skinny()
    timing = failing_while_timed(monkeypatch, "naive", "CUDA error: unspecified launch failure")

    def time_us(fn, inputs):
        x, w = inputs[0]
        timing.append(fn)
        try:
            fn(x, w.t())
        finally:
            timing.pop()
        return 1.0

    inputs = [(torch.randn(5, 40), torch.randn(24, 40))]
    results, baseline = skinny.measure(inputs, ["naive", "parallel"], time_us, 1e-5)
    assert results[0]["error"] == "RuntimeError: CUDA error: unspecified launch failure"
    assert results[0]["ok"] is False and math.isnan(results[0]["us"])
    assert results[0]["rel_error"] < 1e-6  # it passed its check
    assert (results[1]["ok"], results[1]["us"], results[1]["error"]) == (True, 1.0, None)
    assert baseline == 1.0


@pytest.mark.parametrize("dies", [False, True], ids=["context alive", "context dead"])
def test_bench_skinny_main_writes_failed_rows_and_stops_at_a_dead_context(
        dies, tmp_path, monkeypatch, capsys, dying_cuda_context):
    """scripts/bench_skinny.py's main, on CPU tensors standing in for the GPU's: a kernel
    raising while timed fails its row and the run goes on, unless the CUDA context died with
    it: then the rows so far, the failed one last, are written and the exit status is 1."""
    skinny = load_bench_skinny()
    message = "CUDA error: an illegal memory access was encountered"
    timing = failing_while_timed(monkeypatch, "naive", message,
                                 dying_cuda_context if dies else None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Fake GPU")
    monkeypatch.setattr(mmv, "has_cuda", lambda: True)

    def cases(dtypes, shapes, ms, layout, batch):
        for m in ms:
            yield "float32", m, 24, 40, 24 * 40 * 4, [(torch.randn(m, 40), torch.randn(24, 40))
                                                      for _ in range(2)]

    def time_us(fn, inputs):
        timing.append(fn)
        try:
            fn(*inputs[0])
        finally:
            timing.pop()
        return 2.0

    monkeypatch.setattr(skinny, "cases", cases)
    monkeypatch.setattr(skinny, "flush_us", lambda fn, inputs: time_us(
        lambda x, w: fn(x, w.t()), inputs))
    out = tmp_path / "rows.json"
    assert skinny.main(["--m", "1,5", "--dtypes", "float32", "--algorithms", "parallel,naive",
                        "--output", str(out)]) == 1
    rows = json.loads(out.read_text())
    measured = [(1, "parallel", True), (1, "naive", False)]
    measured += [] if dies else [(1, "torch.mm", True), (5, "parallel", True), (5, "naive", False),
                                 (5, "torch.mm", True)]
    assert [(r["m"], r["algorithm"], r["ok"]) for r in rows] == measured
    assert rows[1]["error"] == f"RuntimeError: {message}" and rows[1]["us"] is None
    assert rows[0]["device_name"] == "Fake GPU" and rows[0]["us"] == 2.0
    captured = capsys.readouterr()
    assert f"| 2.0 (1.00x) | ERROR (RuntimeError: {message}) |" in captured.out
    assert ("bench_skinny: the CUDA context is lost" in captured.err) == dies


@pytest.mark.parametrize("dies", [False, True], ids=["context alive", "context dead"])
def test_tune_tiling_a_candidate_raising_while_timed_fails_its_row(dies, dying_cuda_context):
    """scripts/tune_tiling.py: a candidate that passes its check and raises while timed gets a
    failed row and the next is measured; where the CUDA context died with it, ContextLost
    carries the rows so far, the failed one last."""
    tune = load_script("tune_tiling")
    candidates = ((64, 128, 8, 32, 64, 8, 8, 4), (128, 64, 8, 64, 32, 8, 8, 4))
    runs = {config: (lambda a, b: torch.mm(a, b)) for config in candidates}
    message = "CUDA error: an illegal memory access was encountered"

    def time_ms(fn):
        if fn is runs[candidates[0]]:
            if dies:
                dying_cuda_context.append(fn)
            raise RuntimeError(f"{message}\nException raised from launch()")
        return 1.0

    a, b = torch.randn(16, 16), torch.randn(16, 16)
    if dies:
        with pytest.raises(bench.ContextLost) as lost:
            tune.measure("warp_tiling", candidates, a, b, runs.get, time_ms, tf32=False)
        rows = lost.value.rows
    else:
        rows, mm_ms = tune.measure("warp_tiling", candidates, a, b, runs.get, time_ms,
                                   tf32=False)
        assert mm_ms == 1.0
    assert [(r["ok"], r["error"]) for r in rows] == [(False, f"RuntimeError: {message}")] + [
        (True, None)] * (not dies)
    assert rows[0]["rel_error"] < 1e-6 and math.isnan(rows[0]["ms"])


@pytest.mark.parametrize("option", [["--sizes", "abc"], ["--sizes", "4096,0"], ["--jobs", "0"]])
def test_tune_tiling_bad_sizes_or_jobs_get_a_usage_error(option, capsys):
    """Sizes and job counts are checked by argparse before anything is built."""
    tune = load_script("tune_tiling")
    with pytest.raises(SystemExit) as exit_info:
        tune.parse_args(["--rung", "warp_tiling", *option])
    assert exit_info.value.code == 2
    assert option[0] in capsys.readouterr().err


class InProcess:
    """A ProcessPoolExecutor that runs its work here, where a test's stand-ins apply."""

    def __init__(self, *args, **kwargs):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def map(self, fn, *iterables):
        return map(fn, *iterables)


@pytest.fixture
def tune_without_gpu(monkeypatch):
    """scripts/tune_tiling.py on a machine with a CUDA build of torch and its toolkit but no
    GPU: asking for the GPU's capability fails as it does there, and the builds are recorded
    rather than run."""
    from torch.utils import cpp_extension
    tune = load_script("tune_tiling")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "get_device_capability",
                        lambda device=None: pytest.fail("asked the GPU's capability"))
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(cpp_extension, "CUDA_HOME", "/usr/local/cuda")
    monkeypatch.setattr(tune, "ProcessPoolExecutor", InProcess)
    monkeypatch.setattr(tune, "build_only", lambda rung, config, root: (
        tune.built.append(config), tune.tag(config))[1])
    monkeypatch.setenv("MAX_JOBS", "2")
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST", raising=False)
    tune.built = []
    return tune


def test_tune_tiling_builds_without_a_gpu_for_the_arch_asked_for(tune_without_gpu,
                                                                  monkeypatch):
    """--build-only needs no GPU where TORCH_CUDA_ARCH_LIST names the architecture."""
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0a")
    assert tune_without_gpu.main(["--rung", "warp_tiling", "--build-only"]) == 0
    assert tune_without_gpu.built == list(tune_without_gpu.RUNGS["warp_tiling"].candidates)


@pytest.mark.parametrize("build_only", [True, False])
def test_tune_tiling_without_a_gpu_says_what_is_missing(build_only, tune_without_gpu, capsys):
    """Without a GPU, the run says what it lacks before any build: the architecture to build
    for (--build-only), or a GPU to time on; not an AssertionError from torch."""
    with pytest.raises(SystemExit) as exit_info:
        tune_without_gpu.main(["--rung", "warp_tiling"] + ["--build-only"] * build_only)
    assert exit_info.value.code.startswith("tune_tiling: ")
    assert ("TORCH_CUDA_ARCH_LIST" if build_only else "needs a CUDA GPU") in exit_info.value.code
    assert tune_without_gpu.built == []


def test_tune_tiling_on_a_cpu_only_torch_says_so(capsys):
    """With this CPU-only torch, --build-only names what the builds lack."""
    tune = load_script("tune_tiling")
    if torch.version.cuda is not None:
        pytest.skip("torch is a CUDA build")
    with pytest.raises(SystemExit) as exit_info:
        tune.main(["--rung", "warp_tiling", "--build-only"])
    assert "CPU-only build" in exit_info.value.code


@pytest.mark.parametrize("option", [["--m", "0"], ["--m", "1,abc"], ["--shapes", "4096x"],
                                    ["--shapes", "abc"], ["--shapes", "4096x0"],
                                    ["--dtypes", "int8"], ["--output", "{missing}/rows.json"],
                                    ["--output", "{tmp}"], ["--output", "{tmp}/rows.csv"],
                                    ["--algorithms", "nosuch"], ["--algorithms", "auto,,auto"]])
def test_bench_skinny_bad_values_get_a_usage_error_without_a_gpu(option, tmp_path, capsys):
    """Token counts, weight shapes, dtypes, algorithm names and the output file (JSON) are
    checked when parsed, before the run looks for a GPU: a usage error here too, not a traceback
    there, after the weights are made."""
    skinny = load_bench_skinny()
    option = [arg.format(missing=tmp_path / "missing", tmp=tmp_path) for arg in option]
    with pytest.raises(SystemExit) as exit_info:
        skinny.main(option)
    assert exit_info.value.code == 2
    assert option[0] in capsys.readouterr().err


def test_bench_skinny_parses_its_lists():
    args = load_bench_skinny().parse_args(["--m", "1,16", "--shapes", "4096X14336,8x16",
                                           "--dtypes", "float32,bfloat16"])
    assert (args.m, args.shapes, args.dtypes) == ([1, 16], [(4096, 14336), (8, 16)],
                                                  ["float32", "bfloat16"])
