"""The sweep writes one row per (shape, algorithm) and draws its plot."""
from __future__ import annotations

import csv

import pytest
import torch

import torch_mm_variants as mmv
from conftest import failing_while_timed
from torch_mm_variants import bench, sweep


def test_sweep_cpu_rows_and_plot(tmp_path, monkeypatch):
    monkeypatch.setattr(sweep, "shapes", lambda device: [("square", 16, 16, 16, False),
                                                         ("square", 32, 32, 32, False),
                                                         ("linear 48x40", 3, 48, 40, True)])
    pytest.importorskip("matplotlib")
    out, png = tmp_path / "s.csv", tmp_path / "s.png"
    assert sweep.main(["--device", "cpu", "--dtype", "float32", "--repeat", "3",
                       "--output", str(out), "--plot", str(png)]) == 0
    rows = list(csv.DictReader(open(out)))
    names = {r["algorithm"].split(" (")[0] for r in rows}
    assert names == {"auto", "torch.mm", *mmv.algorithms("cpu")}
    assert len(rows) == 3 * (len(mmv.algorithms("cpu")) + 2)
    assert all(float(r["rel_error"]) < 1e-5 and float(r["tflops"]) > 0 for r in rows)
    assert all(r["ok"] == "True" for r in rows)
    assert {r["device_name"] for r in rows} == {bench.device_name(torch.device("cpu"))}
    assert {r["tf32"] for r in rows} == {"False"}  # the CPU's float32 is float32
    assert png.stat().st_size > 10_000


@pytest.mark.parametrize("sizes", [1, 2])
def test_the_time_cap_names_only_what_it_passed_over(sizes, tmp_path, monkeypatch, capsys):
    """An algorithm slower than --time-cap is not run at the family's larger sizes, and the
    sweep says so; one that passes the cap at the family's last size was passed over nowhere."""
    monkeypatch.setattr(sweep, "shapes", lambda device: [("square", s, s, s, False)
                                                         for s in (8, 16)[:sizes]])
    out = tmp_path / "s.csv"
    assert sweep.main(["--device", "cpu", "--dtype", "float32", "--algorithms", "naive",
                       "--time-cap", "1e-12", "--output", str(out), "--plot", ""]) == 0
    rows = list(csv.DictReader(open(out)))
    assert [r["m"] for r in rows if r["algorithm"] == "naive"] == ["8"]
    said = "square: not run past 1e-12 s per call: naive" in capsys.readouterr().out
    assert said == (sizes == 2)


def test_a_wrong_kernel_fails_its_points_and_is_not_timed(tmp_path, monkeypatch, capsys):
    """A kernel off by more than bench's tolerance is run once per point for the check, never
    timed, its rows say ok=False, FAILED is printed and the exit status is non-zero."""
    monkeypatch.setattr(sweep, "shapes", lambda device: [("linear 48x40", m, 48, 40, True)
                                                         for m in (1, 8)])
    product, calls = mmv.matmul, []

    def twice_the_product(a, b, algorithm="auto"):
        calls.append(algorithm)
        return 2 * product(a, b, algorithm)

    monkeypatch.setattr(mmv, "matmul", twice_the_product)
    out = tmp_path / "s.csv"
    assert sweep.main(["--device", "cpu", "--dtype", "float32", "--algorithms", "parallel",
                       "--families", "linear", "--output", str(out), "--plot", ""]) != 0
    assert calls == ["parallel", "parallel"]  # the check at each point, no timed runs
    rows = list(csv.DictReader(open(out)))
    wrong = [r for r in rows if r["algorithm"] == "parallel"]
    assert len(wrong) == 2
    assert all(r["ok"] == "False" and r["ms"] == r["tflops"] == r["pct_of_torch_mm"] == "nan"
               for r in wrong)
    assert all(abs(float(r["rel_error"]) - 1) < 1e-6 for r in wrong)
    baseline = [r for r in rows if r["algorithm"] == "torch.mm"]
    assert len(baseline) == 2 and all(r["ok"] == "True" and float(r["ms"]) > 0 for r in baseline)
    assert capsys.readouterr().out.count("parallel: rel. error 1.0e+00 FAILED") == 2


def test_a_raising_kernel_fails_its_points_and_the_sweep_goes_on(tmp_path, monkeypatch, capsys):
    """A kernel that raises where algorithm_accepts took the inputs fails each point with the
    error's message, is not timed there, the other algorithms and points are measured, and the
    exit status is non-zero."""
    monkeypatch.setattr(sweep, "shapes", lambda device: [("square", s, s, s, False)
                                                         for s in (16, 24)])
    product = mmv.matmul

    def matmul(a, b, algorithm="auto"):
        if algorithm == "naive":
            raise RuntimeError("naive: no kernel for these strides\nException raised from f()")
        return product(a, b, algorithm)

    monkeypatch.setattr(mmv, "matmul", matmul)
    out = tmp_path / "s.csv"
    assert sweep.main(["--device", "cpu", "--dtype", "float32", "--algorithms", "naive,parallel",
                       "--repeat", "3", "--output", str(out), "--plot", ""]) != 0
    rows = list(csv.DictReader(open(out)))
    message = "RuntimeError: naive: no kernel for these strides"
    assert [(r["m"], r["algorithm"], r["ok"], r["error"]) for r in rows] == [
        (m, name, str(name != "naive"), message if name == "naive" else "")
        for m in ("16", "24") for name in ("naive", "parallel", "torch.mm")]
    assert all(float(r["ms"]) > 0 for r in rows if r["algorithm"] != "naive")
    printed = capsys.readouterr().out
    assert f"square 24x24x24 naive: {message} FAILED, not timed" in printed


@pytest.mark.parametrize("dies", [False, True], ids=["context alive", "context dead"])
def test_a_kernel_raising_while_timed_fails_its_point(dies, tmp_path, monkeypatch, capsys,
                                                      dying_cuda_context):
    """A kernel that passes its check and raises while timed fails that point with the error's
    first line and the sweep goes on; where the error left the CUDA context dead, the sweep
    stops there, writes the rows so far (the failed one last) and exits with status 1."""
    monkeypatch.setattr(sweep, "shapes", lambda device: [("square", s, s, s, False)
                                                         for s in (16, 24)])
    message = "CUDA error: an illegal memory access was encountered"
    failing_while_timed(monkeypatch, "naive", message, dying_cuda_context if dies else None)
    out = tmp_path / "s.csv"
    assert sweep.main(["--device", "cpu", "--dtype", "float32", "--algorithms", "parallel,naive",
                       "--repeat", "3", "--output", str(out), "--plot", ""]) == 1
    rows = list(csv.DictReader(open(out)))
    measured = [("16", "parallel", "True"), ("16", "naive", "False")]
    measured += [] if dies else [("16", "torch.mm", "True"), ("24", "parallel", "True"),
                                 ("24", "naive", "False"), ("24", "torch.mm", "True")]
    assert [(r["m"], r["algorithm"], r["ok"]) for r in rows] == measured
    assert rows[1]["error"] == f"RuntimeError: {message}" and rows[1]["ms"] == "nan"
    assert float(rows[1]["rel_error"]) < 1e-6  # it passed its check
    captured = capsys.readouterr()
    assert f"square 16x16x16 naive: RuntimeError: {message} FAILED" in captured.out
    assert ("torch_mm_variants.sweep: the CUDA context is lost" in captured.err) == dies


@pytest.mark.parametrize("option,value,valid", [
    ("--families", "foo", ["square", "linear"]),
    ("--algorithms", "bogus", ["auto", *mmv.algorithms("cpu")]),
    ("--tf32", None, []),  # no TF32 on the CPU: it would only loosen the float32 check
])
def test_unknown_family_or_algorithm_or_cpu_tf32_gets_a_usage_error(option, value, valid, capsys,
                                                        monkeypatch):
    """Refused by argparse before anything is measured, naming the bad value and the valid
    ones, not with an IndexError or a RuntimeError traceback."""
    monkeypatch.setattr(sweep, "measure", lambda *args: pytest.fail("the sweep started"))
    with pytest.raises(SystemExit) as exit_info:
        sweep.main(["--device", "cpu", "--dtype", "float32", option, *[value] * bool(value),
                    "--plot", ""])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert option in err and (value or "") in err
    assert all(name in err for name in valid)


def test_torch_mm_is_timed_beside_each_algorithm(tmp_path, monkeypatch):
    """torch.mm is timed right before and right after each algorithm, whose row compares it
    with the mean of those two; torch.mm's row gives the median of all of its timings."""
    monkeypatch.setattr(sweep, "shapes", lambda device: [("square", 16, 16, 16, False)])
    ran, timed = [], []
    mm, product = torch.mm, mmv.matmul
    monkeypatch.setattr(torch, "mm", lambda a, b: ran.append("torch.mm") or mm(a, b))
    monkeypatch.setattr(mmv, "matmul", lambda a, b, name="auto": ran.append(name)
                        or product(a, b, name))

    def fake_time_ms(step, device, repeat):  # a clock that rises with every measurement
        step()
        timed.append(ran[-1])
        return float(len(timed))

    monkeypatch.setattr(sweep.bench, "time_ms", fake_time_ms)
    out = tmp_path / "s.csv"
    assert sweep.main(["--device", "cpu", "--dtype", "float32", "--algorithms", "naive,parallel",
                       "--output", str(out), "--plot", ""]) == 0
    assert timed == ["torch.mm", "naive", "torch.mm", "torch.mm", "parallel", "torch.mm"]
    rows = {r["algorithm"]: r for r in csv.DictReader(open(out))}
    assert float(rows["naive"]["ms"]) == 2 and float(rows["naive"]["torch_mm_ms"]) == 2
    assert float(rows["parallel"]["ms"]) == 5 and float(rows["parallel"]["torch_mm_ms"]) == 5
    assert float(rows["parallel"]["pct_of_torch_mm"]) == 100
    assert float(rows["torch.mm"]["ms"]) == 3.5  # the median of 1, 3, 4 and 6


def test_shapes_an_algorithm_refuses_are_listed(tmp_path, monkeypatch, capsys):
    """An algorithm that does not take a shape (its `accepts`) is not run there, and the sweep
    says where and why instead of leaving it out silently."""
    monkeypatch.setattr(sweep, "shapes", lambda device: [("square", s, s, s, False)
                                                         for s in (16, 32, 48)])
    accepts = mmv._C.algorithm_accepts

    def naive_only_below_32(name, a, b):
        if name == "naive" and a.shape[0] >= 32:
            return False, "at most 31 rows"
        return accepts(name, a, b)

    monkeypatch.setattr(mmv._C, "algorithm_accepts", naive_only_below_32)
    out = tmp_path / "s.csv"
    assert sweep.main(["--device", "cpu", "--dtype", "float32", "--algorithms", "naive,parallel",
                       "--output", str(out), "--plot", ""]) == 0
    rows = list(csv.DictReader(open(out)))
    assert [r["m"] for r in rows if r["algorithm"] == "naive"] == ["16"]
    assert "square: naive not run at 32x32x32, 48x48x48: at most 31 rows" in capsys.readouterr().out


@pytest.mark.parametrize("option", ["--output", "--plot"])
def test_unwritable_output_gets_a_usage_error_before_the_sweep(option, tmp_path, capsys,
                                                               monkeypatch):
    """A CSV or plot path in a directory that does not exist is refused by argparse before
    anything is measured, not with a traceback after the whole sweep."""
    monkeypatch.setattr(sweep, "measure", lambda *args: pytest.fail("the sweep started"))
    with pytest.raises(SystemExit) as exit_info:
        sweep.main(["--device", "cpu", "--output", str(tmp_path / "s.csv"),
                    option, str(tmp_path / "missing" / ("s.csv" if option == "--output"
                                                        else "s.png"))])
    assert exit_info.value.code == 2
    assert option in capsys.readouterr().err


@pytest.mark.parametrize("option", [
    ["--output", "s.json"],  # the sweep writes CSV whatever the name says
    ["--output", "{tmp}"],  # a directory
    ["--output", ""],
    ["--plot", "s.txt"],
    ["--repeat", "0"],
    ["--time-cap", "0"],  # every algorithm would stop after its first point
    ["--families", ""],  # not every family
    ["--algorithms", ""],
    ["--time-cap", "abc"],
    pytest.param(["--device", "cuda"], marks=pytest.mark.skipif(
        torch.cuda.is_available(), reason="a GPU is visible")),
])
def test_bad_values_get_a_usage_error_before_the_sweep(option, tmp_path, capsys, monkeypatch):
    """Each is refused by argparse, naming the option, before anything is measured: not run
    with a meaningless value, nor failing after the whole sweep."""
    option = [arg.format(tmp=tmp_path) for arg in option]
    monkeypatch.setattr(sweep, "measure", lambda *args: pytest.fail("the sweep started"))
    with pytest.raises(SystemExit) as exit_info:
        sweep.main(["--device", "cpu", "--output", str(tmp_path / "s.csv"), "--plot", "",
                    "--algorithms", "naive", *option])
    assert exit_info.value.code == 2
    assert option[0] in capsys.readouterr().err


def test_the_cuda_device_asked_for_is_made_current(tmp_path, monkeypatch):
    """--device cuda:1 makes cuda:1 the current device before anything is measured: do_bench's
    events and L2 flush, and the kernels' streams, belong to the current device."""
    current = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", current.append)
    monkeypatch.setattr(sweep, "shapes", lambda device: [("square", 8, 8, 8, False)])

    def measure(family, m, n, k, weight_layout, dtype, device, *rest):
        assert current == [torch.device("cuda", 1)] and device == torch.device("cuda", 1)
        return [{"family": family, "algorithm": "torch.mm", "ok": True}]

    monkeypatch.setattr(sweep, "measure", measure)
    assert sweep.main(["--device", "cuda:1", "--output", str(tmp_path / "s.csv"),
                       "--plot", ""]) == 0
    assert current == [torch.device("cuda", 1)]
