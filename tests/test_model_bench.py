"""The end-to-end decoder benchmark: same outputs as the original model, eager and compiled
with fullgraph=True (so the swapped Linear layers cause no graph break)."""
from __future__ import annotations

import json

import pytest
import torch

import torch_mm_variants as mmv
from torch_mm_variants import model_bench


def test_swapped_decoder_matches_and_compiles(tmp_path):
    out = tmp_path / "rows.json"
    assert model_bench.main(["--device", "cpu", "--size", "tiny", "--dtype", "float32",
                             "--prefill", "24", "--decode", "1,5", "--repeat", "3",
                             "--output", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert [(r["mode"], r["phase"], r["tokens"]) for r in rows] == [
        (mode, phase, tokens) for mode in ["eager", "compile"]
        for phase, tokens in [("prefill", 24), ("decode", 1), ("decode", 5)]]
    assert all(r["max_rel_diff"] < 1e-4 and r["ours_ms"] > 0 and r["original_ms"] > 0 for r in rows)
    assert {r["device_name"] for r in rows} == {model_bench.bench.device_name(torch.device("cpu"))}
    # Checked against a float64 copy of the model: as close as the original is, or closer.
    assert all(r["ok"] and r["rel_error"] < 1e-5 and r["original_rel_error"] < 1e-5 for r in rows)


def test_every_linear_is_swapped():
    original, swapped = model_bench.build_models(model_bench.SIZES["tiny"], "cpu", torch.float32, "auto")
    linears = [m for m in swapped.modules() if isinstance(m, torch.nn.Linear)]
    assert len(linears) == 2 * 7 + 1 and all(isinstance(m, mmv.Linear) for m in linears)
    assert not any(isinstance(m, mmv.Linear) for m in original.modules())


def test_unwritable_output_gets_a_usage_error_before_the_run(tmp_path, capsys, monkeypatch):
    """An --output in a directory that does not exist is refused by argparse before the models
    are built and timed, not with a traceback at the end."""
    monkeypatch.setattr(model_bench, "run", lambda args: pytest.fail("the run started"))
    with pytest.raises(SystemExit) as exit_info:
        model_bench.main(["--device", "cpu", "--output", str(tmp_path / "missing" / "r.json")])
    assert exit_info.value.code == 2
    assert "--output" in capsys.readouterr().err


def test_the_cuda_device_asked_for_is_made_current(monkeypatch):
    """--device cuda:1 makes cuda:1 the current device before the models are built and timed:
    do_bench's events and L2 flush belong to the current device."""
    current = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", current.append)

    class Built(Exception):
        pass

    def build_models(config, device, dtype, algorithm):
        assert current == [torch.device("cuda", 1)] and device == torch.device("cuda", 1)
        raise Built  # far enough: nothing of the GPU run can follow here

    monkeypatch.setattr(model_bench, "build_models", build_models)
    with pytest.raises(Built):
        model_bench.main(["--device", "cuda:1"])


def test_a_wrong_model_fails_its_check_and_is_not_timed(tmp_path, monkeypatch, capsys):
    """Outputs further from the float64 model's than the original's are reported as FAILED,
    neither model is timed at that step, and the exit status is 1."""
    forward = mmv.Linear.forward
    monkeypatch.setattr(mmv.Linear, "forward", lambda self, x: 1.01 * forward(self, x))
    monkeypatch.setattr(model_bench, "time_step", lambda *args: pytest.fail("timed"))
    out = tmp_path / "rows.json"
    assert model_bench.main(["--device", "cpu", "--size", "tiny", "--dtype", "float32",
                             "--prefill", "8", "--decode", "1", "--no-compile",
                             "--output", str(out)]) == 1
    # Times not taken are null: JSON has no NaN, and strict parsers reject Python's.
    rows = json.loads(out.read_text(), parse_constant=lambda c: pytest.fail(f"{c} in the JSON"))
    assert [r["ok"] for r in rows] == [False, False]
    assert all(r["rel_error"] > 1e-3 and r["original_rel_error"] < 1e-5 for r in rows)
    assert [(r["ours_ms"], r["original_ms"], r["speedup"]) for r in rows] == [(None,) * 3] * 2
    assert capsys.readouterr().out.count("FAILED") == 2


@pytest.mark.parametrize("option", [["--prefill", "0"], ["--prefill", "-3"], ["--decode", "0"],
                                    ["--decode", "1,-8"], ["--decode", "abc"], ["--repeat", "0"],
                                    ["--algorithm", "bogus"], ["--algorithm", "wgmma"]])
def test_bad_counts_or_algorithm_get_a_usage_error_before_the_run(option, capsys, monkeypatch):
    """Token counts and repetitions below 1 or not whole numbers, and an algorithm the device
    lacks, are refused by argparse before any model is built."""
    monkeypatch.setattr(model_bench, "build_models", lambda *args: pytest.fail("models built"))
    with pytest.raises(SystemExit) as exit_info:
        model_bench.main(["--device", "cpu", "--no-compile", *option])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert option[0] in err and "<lambda>" not in err
    if option[0] == "--algorithm":  # the valid ones are named
        assert all(name in err for name in ["auto"] + mmv.algorithms("cpu"))
    if option[1] == "abc":
        assert "not a whole number" in err


def failing_decode(monkeypatch, dead=None) -> list:
    """Makes our Linear layers raise as a kernel does at the one-token decode step, while the
    list returned is not empty (model_bench.time_step fills it while it times); with
    dying_cuda_context's list as `dead`, the error kills the fake CUDA context."""
    timing, forward, time_step = [], mmv.Linear.forward, model_bench.time_step

    def failing(self, x):
        if timing and x.shape[-2] == 1:
            if dead is not None:
                dead.append(self)
            raise RuntimeError("CUDA error: an illegal memory access was encountered\n"
                               "Exception raised from launch()")
        return forward(self, x)

    def timed(model, tokens, device, repeat):
        timing.append(model)
        try:
            return time_step(model, tokens, device, repeat)
        finally:
            timing.pop()

    monkeypatch.setattr(mmv.Linear, "forward", failing)
    monkeypatch.setattr(model_bench, "time_step", timed)
    return timing


ARGS = ["--device", "cpu", "--size", "tiny", "--dtype", "float32", "--prefill", "8",
        "--decode", "1,4", "--repeat", "3", "--no-compile"]
MESSAGE = "RuntimeError: CUDA error: an illegal memory access was encountered"


@pytest.mark.parametrize("dies", [False, True], ids=["context alive", "context dead"])
def test_a_model_raising_while_timed_fails_its_row(dies, tmp_path, monkeypatch, capsys,
                                                   dying_cuda_context):
    """A step where our model raises gets a failed row with the error's first line and the
    run goes on to the other steps; where the error left the CUDA context dead, the run stops
    there. Either way the rows measured are written and the exit status is 1."""
    failing_decode(monkeypatch, dying_cuda_context if dies else None)
    out = tmp_path / "rows.json"
    assert model_bench.main([*ARGS, "--output", str(out)]) == 1
    rows = json.loads(out.read_text())
    measured = [("prefill", 8, True), ("decode", 1, False)] + [("decode", 4, True)] * (not dies)
    assert [(r["phase"], r["tokens"], r["ok"]) for r in rows] == measured
    assert rows[1]["error"] == MESSAGE and rows[1]["ours_ms"] is None
    assert rows[1]["rel_error"] < 1e-5  # it passed its check
    captured = capsys.readouterr()
    assert f"FAILED ({MESSAGE})" in captured.out
    assert ("model_bench: the CUDA context is lost" in captured.err) == dies


def test_a_model_raising_in_its_check_fails_its_row(tmp_path, monkeypatch):
    """A model that raises before it could be checked is reported as failed, not timed."""
    forward = mmv.Linear.forward
    monkeypatch.setattr(mmv.Linear, "forward", lambda self, x: (
        forward(self, x) if x.shape[-2] != 1 else mmv.matmul(x, x, "no such algorithm")))
    out = tmp_path / "rows.json"
    assert model_bench.main([*ARGS, "--output", str(out)]) == 1
    rows = json.loads(out.read_text())
    assert [r["ok"] for r in rows] == [True, False, True]
    assert rows[1]["error"].startswith("RuntimeError") and rows[1]["rel_error"] is None
    assert (rows[1]["ours_ms"], rows[1]["original_ms"]) == (None, None)
