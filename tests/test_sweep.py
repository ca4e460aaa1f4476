"""The sweep writes one row per (shape, algorithm) and draws its plot."""
from __future__ import annotations

import csv

import pytest

import torch_mm_variants as mmv
from torch_mm_variants import sweep


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
    assert png.stat().st_size > 10_000
