"""The benchmark runs every registered algorithm, checks it and writes its rows."""
from __future__ import annotations

import csv
import json

import torch_mm_variants as mmv
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


def test_parse_size():
    assert bench.parse_size("64") == (64, 64, 64)
    assert bench.parse_size("1x4096x14336") == (1, 4096, 14336)
