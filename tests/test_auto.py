"""algorithm="auto": the heuristic, the measured mode, its cache file, and its explanation."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
import warnings

import pytest
import torch

import torch_mm_variants as mmv
from torch_mm_variants import tuning
from conftest import (assert_matches_reference, capture_graph, child_env, gpu_available,
                      tf32_allowed)

# Measures the buckets M = 2^process, K = 2^k for k < buckets. Each process says it has imported
# torch (the slow part), then waits for the start file, so that all of them save at once.
MEASURE_BUCKETS = """
import os, sys, time, torch, torch_mm_variants as mmv
process, start, buckets = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
open(f"{start}.{process}", "w").close()
while not os.path.exists(start):
    time.sleep(0.01)
for k in range(buckets):
    a, b = torch.randn(2**process, 2**k), torch.randn(2**k, 1)
    assert mmv.explain_auto(a, b)["reason"] == "measured"
"""


def wait_for(paths, timeout_s=120):
    deadline = time.monotonic() + timeout_s
    while not all(os.path.exists(p) for p in paths):
        assert time.monotonic() < deadline, "child processes did not start"
        time.sleep(0.05)


@pytest.fixture
def measured_mode(tmp_path, monkeypatch):
    monkeypatch.setenv("MM_VARIANTS_CACHE_DIR", str(tmp_path))
    tuning.clear()
    mmv.set_autotune(True)
    yield tuning.cache_file()
    mmv.set_autotune(False)
    tuning.clear()
    tuning.load_cache(tmp_path / "absent.json")


# A CPU bucket's device part: its vector instructions and thread count.
CPU = f"cpu {mmv._C.cpu_isa()} {torch.get_num_threads()} threads"

def test_heuristic_by_default():
    a, b = torch.randn(50, 40), torch.randn(40, 30)
    decision = mmv.explain_auto(a, b)
    assert decision["reason"] == "heuristic"
    assert decision["algorithm"] == mmv.algorithms("cpu")[-1]
    assert decision["bucket"] == f"{CPU}|Float|rr|64x32x64"


def test_bucket_names_layout_and_dtype():
    a = torch.randn(40, 50, dtype=torch.bfloat16).t()
    assert mmv.explain_auto(a, torch.randn(40, 3, dtype=torch.bfloat16))["bucket"] == f"{CPU}|BFloat16|cr|64x4x64"



def test_cpu_buckets_name_the_threads_and_instructions():
    """Choices measured with other threads or vector instructions (another machine sharing the
    cache, a process with torch.set_num_threads(1)) are kept under a key of their own."""
    a, b = torch.randn(50, 40), torch.randn(40, 30)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one_thread = mmv.explain_auto(a, b)["bucket"]
    finally:
        torch.set_num_threads(threads)
    assert one_thread.startswith(f"cpu {mmv._C.cpu_isa()} 1 threads|")
    isa = mmv._C.cpu_isa()
    try:
        mmv._C.set_cpu_isa("generic")
        generic = mmv.explain_auto(a, b)["bucket"]
    finally:
        mmv._C.set_cpu_isa(isa)
    assert generic.startswith(f"cpu generic {threads} threads|")

@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_cpu_thin_products_run_rung_4(dtype):
    """On the CPU, a product that the packed rungs would pad to whole micro-kernel blocks of four
    times its output or more (a dot product; a row against 256 columns) runs tiled_register,
    unless parallel has several tiles to spread over its threads (a row against 300 columns)."""
    def choice(m, k, n):
        return mmv.explain_auto(torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype))
    assert choice(1, 4096, 1)["algorithm"] == "tiled_register"
    assert choice(1, 4096, 256)["algorithm"] == "tiled_register"
    assert choice(1, 4096, 300)["algorithm"] == "parallel"
    assert choice(200, 64, 200)["algorithm"] == "parallel"
    assert_matches_reference(torch.randn(1, 4096, dtype=dtype), torch.randn(4096, 1, dtype=dtype),
                             "auto")


def test_measured_mode_times_rung_4_only_where_the_packed_rungs_defer(measured_mode):
    """tiled_register is measured for a dot product, where rungs 5 and 6 pass it over; not for a
    square product (it is no candidate there, so it cannot be the measured winner)."""
    thin = mmv.explain_auto(torch.randn(1, 8192), torch.randn(8192, 1))
    assert thin["reason"] == "measured" and thin["algorithm"] == "tiled_register"
    square = mmv.explain_auto(torch.randn(96, 96), torch.randn(96, 96))
    assert square["reason"] == "measured" and square["algorithm"] in ("simd_packed", "parallel")


def test_measured_mode_measures_once_and_saves(measured_mode):
    a, b = torch.randn(70, 90), torch.randn(90, 33)
    first = mmv.explain_auto(a, b)
    assert first["reason"] == "measured" and first["algorithm"] in mmv.algorithms("cpu")
    again = mmv.explain_auto(torch.randn(65, 100), torch.randn(100, 40))  # same bucket
    assert again == {**first, "reason": "cached"}
    assert json.loads(measured_mode.read_text()) == {first["bucket"]: first["algorithm"]}
    assert_matches_reference(a, b, "auto")


def test_measured_mode_leaves_empty_products_to_the_heuristic(measured_mode):
    """A product with a zero dimension launches no kernel, so there is nothing to time, and it
    must not file a choice under the bucket that real one-row calls share."""
    for (m, k, n) in [(0, 30, 20), (5, 0, 20), (5, 30, 0)]:
        a, b = torch.randn(m, k), torch.randn(k, n)
        assert mmv.explain_auto(a, b)["reason"] == "heuristic"
        assert torch.equal(mmv.matmul(a, b), torch.zeros(a.shape[0], b.shape[1]))
    assert not measured_mode.exists()
    assert mmv.explain_auto(torch.randn(1, 30), torch.randn(30, 20))["reason"] == "measured"


def test_concurrent_processes_keep_each_others_choices(tmp_path):
    """Each save merges into the file under a lock, so no process drops another's buckets."""
    processes, buckets = 6, 10
    start = str(tmp_path / "start")
    env = child_env(MM_VARIANTS_AUTOTUNE="1", MM_VARIANTS_CACHE_DIR=str(tmp_path))
    children = [subprocess.Popen([sys.executable, "-c", MEASURE_BUCKETS, str(p), start,
                                  str(buckets)], env=env) for p in range(processes)]
    wait_for([f"{start}.{p}" for p in range(processes)])
    open(start, "w").close()
    assert all(child.wait(timeout=300) == 0 for child in children)
    saved = json.loads((tmp_path / tuning.cache_file().name).read_text())
    shapes = [((2**p, 2**k), (2**k, 1)) for p in range(processes) for k in range(buckets)]
    assert set(saved) == {mmv.explain_auto(torch.randn(a), torch.randn(b))["bucket"]
                          for a, b in shapes}
    assert [p.name for p in tmp_path.iterdir() if ".tmp" in p.name] == []


def test_a_save_keeps_entries_saved_by_another_process(measured_mode):
    """Another process's buckets survive this process's save; on a bucket both hold, this
    process's fresh measurement wins."""
    ours = f"{CPU}|Float|rr|128x64x128"
    measured_mode.write_text(json.dumps({f"{CPU}|Float|rr|1x1x1": "naive", ours: "stale"}, indent=2))
    chosen = mmv.explain_auto(torch.randn(70, 90), torch.randn(90, 33))
    assert chosen["bucket"] == ours
    assert json.loads(measured_mode.read_text()) == {f"{CPU}|Float|rr|1x1x1": "naive",
                                                     ours: chosen["algorithm"]}


def test_a_save_replaces_a_corrupt_file(measured_mode):
    measured_mode.write_text('{"' + CPU + '|Float|rr|1x1x1": ')
    chosen = mmv.explain_auto(torch.randn(70, 90), torch.randn(90, 33))
    assert json.loads(measured_mode.read_text()) == {chosen["bucket"]: chosen["algorithm"]}


def test_a_save_writes_json_whatever_the_file_held(measured_mode):
    """Keys another writer left with control characters, characters past ASCII (as Python's json
    escapes them, a surrogate pair among them) and a lone surrogate survive a save as JSON that
    Python reads back, with the lone surrogate as U+FFFD: before, a tab went back raw, and every
    later process read the file as empty."""
    odd = {"note\tx": "parallel", "line\nend\x01": "tiled", "caf\u00e9 \U0001f600": "naive"}
    measured_mode.write_text(json.dumps({**odd, "lone \ud800": "tiled"}))  # ASCII, all escaped
    chosen = mmv.explain_auto(torch.randn(70, 90), torch.randn(90, 33))
    assert json.loads(measured_mode.read_text()) == {**odd, "lone \ufffd": "tiled",
                                                     chosen["bucket"]: chosen["algorithm"]}


def test_a_save_writes_only_what_this_process_measured(measured_mode):
    """Entries this process only loaded are left to the file: what another process measured
    since, or removed, stands after this process saves a bucket of its own."""
    theirs, gone = f"{CPU}|Float|rr|1x1x1", f"{CPU}|Float|rr|2x2x2"
    measured_mode.write_text(json.dumps({theirs: "naive", gone: "naive"}))
    assert tuning.load_cache() == 2
    measured_mode.write_text(json.dumps({theirs: "tiled"}))  # another process since
    chosen = mmv.explain_auto(torch.randn(70, 90), torch.randn(90, 33))
    assert chosen["reason"] == "measured"
    assert json.loads(measured_mode.read_text()) == {theirs: "tiled",
                                                     chosen["bucket"]: chosen["algorithm"]}


def test_a_file_of_other_values_is_not_loaded(measured_mode):
    """A tuning file holds strings only: one holding anything else is read as no file, by the
    loader as by the saves, which replace it."""
    measured_mode.write_text(json.dumps({"x": {"nested": 1}, f"{CPU}|Float|rr|1x1x1": "naive"}))
    assert tuning.load_cache() == 0 and tuning.tuned_entries() == {}
    chosen = mmv.explain_auto(torch.randn(70, 90), torch.randn(90, 33))
    assert json.loads(measured_mode.read_text()) == {chosen["bucket"]: chosen["algorithm"]}


def test_a_save_never_writes_through_a_link(measured_mode, tmp_path):
    """The temporary file a save writes is created afresh: names that someone placed as links
    beside the cache (in a shared folder) are passed over, and what they point at is untouched."""
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    links = [measured_mode.with_name(f"{measured_mode.name}.tmp.{os.getpid()}{suffix}")
             for suffix in ["", *(f".{i}" for i in range(8))]]
    for link in links:
        link.symlink_to(victim)
    mmv.explain_auto(torch.randn(70, 90), torch.randn(90, 33))
    assert victim.read_text() == "keep"
    assert all(link.is_symlink() for link in links)
    assert not measured_mode.exists() or not measured_mode.is_symlink()


def test_set_autotune_loads_the_file_it_saves_to(measured_mode):
    """Switched on after the cache folder changed (or could not be placed at import),
    set_autotune loads what the file there holds, rather than measuring it again and
    overwriting it."""
    a, b = torch.randn(70, 90), torch.randn(90, 33)
    mmv.set_autotune(False)
    bucket = mmv.explain_auto(a, b)["bucket"]
    measured_mode.write_text(json.dumps({bucket: "simd_packed"}))  # not the heuristic's pick
    mmv.set_autotune(True)
    assert mmv.explain_auto(a, b) == {"algorithm": "simd_packed", "reason": "cached",
                                      "bucket": bucket}
    assert json.loads(measured_mode.read_text()) == {bucket: "simd_packed"}


def test_fake_tensors_are_not_measured(measured_mode):
    """Under FakeTensorMode (tracing) explain_auto answers from the heuristic instead of timing
    kernels on tensors that hold no data, on fake inputs as on real ones."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    real_a, real_b = torch.randn(37, 6), torch.randn(6, 7)
    with FakeTensorMode():
        fake = mmv.explain_auto(torch.randn(37, 6), torch.randn(6, 7))
        real = mmv.explain_auto(real_a, real_b)
    assert fake["reason"] == real["reason"] == "heuristic"
    assert not measured_mode.exists() and tuning.tuned_entries() == {}
    assert mmv.explain_auto(real_a, real_b)["reason"] == "measured"


def test_explain_auto_speaks_for_the_autocast_dtype(measured_mode):
    """Under torch.autocast matmul runs, and measures, in the autocast dtype: explain_auto names
    that bucket and that choice."""
    a, b = torch.randn(100, 70), torch.randn(70, 60)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert mmv.matmul(a, b).dtype == torch.bfloat16
        decision = mmv.explain_auto(a, b)
    [(bucket, ran)] = tuning.tuned_entries().items()
    assert decision == {"algorithm": ran, "reason": "cached", "bucket": bucket}
    assert "|BFloat16|" in bucket


@pytest.mark.skipif(not gpu_available(), reason="needs a GPU")
def test_float32_buckets_name_tf32_on_gpu():
    """float32 on a GPU runs other kernels with TF32 allowed than without (wgmma leaves full
    precision to tensor_core), so the two keep separate choices; on the CPU TF32 changes
    nothing."""
    a, b = torch.randn(300, 200, device="cuda"), torch.randn(200, 100, device="cuda")
    full = mmv.explain_auto(a, b)["bucket"]
    with tf32_allowed():
        tf32 = mmv.explain_auto(a, b)["bucket"]
        cpu = mmv.explain_auto(a.cpu(), b.cpu())["bucket"]
    assert "|Float|" in full and "|Float(tf32)|" in tf32
    assert cpu == mmv.explain_auto(a.cpu(), b.cpu())["bucket"] and "|Float|" in cpu


@pytest.mark.parametrize("explain", [mmv.explain_auto, mmv.auto_choice], ids=["explain", "choice"])
def test_explaining_what_is_not_a_tensor(explain):
    """explain_auto and auto_choice name the argument that is not a tensor, as matmul does,
    instead of pybind's list of overloads with the whole tensor printed."""
    t = torch.randn(3, 3)
    for a, b, name, position, kind in [(t, [1], "b", 2, "list"), (None, t, "a", 1, "NoneType")]:
        with pytest.raises(TypeError, match=re.escape(
                f"torch_mm_variants.explain_auto(): argument '{name}' (position {position}) "
                f"must be Tensor, not {kind}")):
            explain(a, b)


def test_lone_surrogates_in_the_file_are_skipped(tmp_path):
    """A key or name holding a lone surrogate (valid JSON, no UTF-8 form) is left out at import;
    it used to stop the import with a TypeError."""
    path = tmp_path / "surrogates.json"
    path.write_text('{"\\ud800": "tiled", "x": "\\udfff", "y": "naive"}')
    try:
        assert tuning.load_cache(path) == 1
        assert tuning.tuned_entries() == {"y": "naive"}
    finally:
        tuning.clear()


def test_import_without_a_home_directory(tmp_path):
    """Where the cache's folder names a home directory that cannot be found (no HOME and no
    account entry, as under an arbitrary user id in a container), the package imports and
    measures, keeping its choices in memory with a warning, and cache_file names the variables
    to set."""
    child = subprocess.run(
        [sys.executable, "-c", "import torch, torch_mm_variants as mmv\n"
         "print(mmv.explain_auto(torch.randn(9, 9), torch.randn(9, 9))['reason'])\n"
         "mmv.tuning.cache_file()"],
        env=child_env(MM_VARIANTS_AUTOTUNE="1", MM_VARIANTS_CACHE_DIR="~no_such_user_mmv/c"),
        capture_output=True, text=True, cwd=tmp_path)
    assert child.stdout.split() == ["measured"], child.stderr[-2000:]
    assert "UserWarning: torch_mm_variants: measured choices are kept in memory only" in \
        child.stderr
    assert re.search(r"RuntimeError: torch_mm_variants: the folder for measured choices, "
                     r"'~no_such_user_mmv/c', cannot be placed .*MM_VARIANTS_CACHE_DIR",
                     child.stderr), child.stderr[-2000:]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("value, enabled", [("1", True), ("true", True), (" Yes ", True),
                                            ("ON", True), ("0", False), ("False", False),
                                            (" no", False), ("off", False), ("", False),
                                            (None, False)])
def test_autotune_variable_values(value, enabled, monkeypatch):
    if value is None:
        monkeypatch.delenv("MM_VARIANTS_AUTOTUNE", raising=False)
    else:
        monkeypatch.setenv("MM_VARIANTS_AUTOTUNE", value)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert tuning.autotune_requested() == enabled


def test_autotune_variable_warns_about_other_values(monkeypatch):
    monkeypatch.setenv("MM_VARIANTS_AUTOTUNE", "ture")
    with pytest.warns(UserWarning, match=r"MM_VARIANTS_AUTOTUNE='ture'.*1, true, yes, on"):
        assert not tuning.autotune_requested()


@pytest.mark.parametrize("value, enabled", [(" True ", True), ("ture", False)])
def test_autotune_variable_is_read_at_import(value, enabled, tmp_path):
    """A new process takes the variable at import, and warns once about a value it does not
    understand."""
    child = subprocess.run(
        [sys.executable, "-c", "import torch_mm_variants as mmv; print(mmv._C.autotune_enabled())"],
        env=child_env(MM_VARIANTS_AUTOTUNE=value, MM_VARIANTS_CACHE_DIR=str(tmp_path)),
        capture_output=True, text=True, check=True)
    assert child.stdout.split() == [str(enabled)]
    assert child.stderr.count("UserWarning: MM_VARIANTS_AUTOTUNE=") == (0 if enabled else 1)


@pytest.mark.parametrize("value", ["false", "0", "", 0, 1, None, torch.tensor(True)],
                         ids=["false", "zero_str", "empty", "zero", "one", "none", "tensor"])
def test_set_autotune_refuses_what_is_not_a_bool(value):
    """set_autotune takes True or False only: a string such as "false" is refused by name, not
    read by its truth value (which switched the measured mode on), and the mode is left as it
    was."""
    assert not tuning._C.autotune_enabled()
    with pytest.raises(TypeError, match=rf"set_autotune: enabled must be True or False, not "
                       rf"{type(value).__name__} {re.escape(repr(value))}"):
        mmv.set_autotune(value)
    assert not tuning._C.autotune_enabled()


def test_empty_cache_dir_variable_counts_as_unset(tmp_path, monkeypatch):
    """An empty MM_VARIANTS_CACHE_DIR must not put the file in the current directory."""
    monkeypatch.setenv("MM_VARIANTS_CACHE_DIR", "")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert tuning.cache_file().parent == tmp_path / "torch_mm_variants"


def test_cache_dir_variable_takes_home_and_relative_folders(tmp_path, monkeypatch):
    """~ is the home directory (it made a folder named ~ in the current one), and a relative
    folder is taken from the current directory once, as an absolute path."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("MM_VARIANTS_CACHE_DIR", "~/choices")
    assert tuning.cache_file().parent == tmp_path / "home" / "choices"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MM_VARIANTS_CACHE_DIR", "relative")
    assert tuning.cache_file().parent == tmp_path / "relative"


def test_a_relative_cache_folder_stays_where_it_was_first_taken(tmp_path, monkeypatch):
    """A relative folder names one file for the whole process: switched on after the process
    moved, the measured mode saves where the file was named, and a process started from there
    again finds the choices."""
    first, later = tmp_path / "first", tmp_path / "later"
    first.mkdir()
    later.mkdir()
    monkeypatch.chdir(first)
    monkeypatch.setenv("MM_VARIANTS_CACHE_DIR", f"choices-{os.getpid()}-{tmp_path.name}")
    named = tuning.cache_file()
    monkeypatch.chdir(later)
    tuning.clear()
    try:
        mmv.set_autotune(True)
        chosen = mmv.explain_auto(torch.randn(70, 90), torch.randn(90, 33))
    finally:
        mmv.set_autotune(False)
        tuning.clear()
        tuning.load_cache(tmp_path / "absent.json")
    assert named.parent.parent == first
    assert json.loads(named.read_text()) == {chosen["bucket"]: chosen["algorithm"]}
    assert not any(later.iterdir())


def test_saved_choices_are_reused_by_a_new_process(measured_mode):
    a, b = torch.randn(20, 20), torch.randn(20, 20)
    chosen = mmv.explain_auto(a, b)
    mmv.set_autotune(False)
    tuning.clear()
    assert mmv.explain_auto(a, b)["reason"] == "heuristic"
    assert tuning.load_cache(measured_mode) == 1  # what a new process does at import
    assert mmv.explain_auto(a, b) == {**chosen, "reason": "cached"}


def test_deeply_nested_file_is_ignored(tmp_path):
    """A cache file too deeply nested for the JSON parser is skipped like any unreadable one
    (it is read at import)."""
    path = tmp_path / "nested.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    try:
        assert tuning.load_cache(path) == 0
    finally:
        tuning.clear()


def test_empty_products_of_huge_sizes():
    """Sizes past 2^62 share the last bucket: auto answers at once, as torch.mm does."""
    a, b = torch.empty(0, 2**62 + 1), torch.empty(2**62 + 1, 0)
    assert mmv.matmul(a, b).shape == (0, 0)
    assert mmv.explain_auto(a, b)["bucket"].endswith(f"x{2**62}")


def test_unknown_names_in_the_file_are_ignored(tmp_path):
    a, b = torch.randn(8, 8), torch.randn(8, 8)
    bucket = mmv.explain_auto(a, b)["bucket"]
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({bucket: "no_such_kernel"}))
    try:
        tuning.load_cache(path)
        assert mmv.explain_auto(a, b)["reason"] == "heuristic"
    finally:
        tuning.clear()


def test_measured_mode_is_thread_safe(measured_mode):
    a, b = torch.randn(100, 100), torch.randn(100, 100)
    results, errors = [], []

    def worker():
        try:
            results.append(mmv.matmul(a, b))
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(results) == 8
    assert all(torch.allclose(r, a @ b, rtol=1e-4, atol=1e-4) for r in results)
    assert len(tuning.tuned_entries()) == 1


@pytest.mark.skipif(not gpu_available(), reason="needs a GPU")
def test_measured_mode_on_gpu_and_not_during_graph_capture(measured_mode):
    a = torch.randn(256, 512, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(512, 384, device="cuda", dtype=torch.bfloat16)
    assert mmv.explain_auto(a, b)["reason"] == "measured"
    c = torch.randn(96, 80, device="cuda", dtype=torch.bfloat16)  # a bucket not yet measured
    d = torch.randn(80, 72, device="cuda", dtype=torch.bfloat16)
    mmv.matmul(c, d)  # warm-up outside the capture (this measures), then forget the choice
    tuning.clear()
    graph, out = capture_graph(lambda: mmv.matmul(c, d))
    graph.replay()
    torch.cuda.synchronize()
    assert tuning.tuned_entries() == {}  # nothing measured inside the capture
    assert torch.allclose(out.float(), (c.double() @ d.double()).float(), rtol=2e-2, atol=2e-1)


def batch_b(shared: bool) -> torch.Tensor:
    """b for a batch of 4 products of [64, 128] by [128, 32]: an nn.Linear weight's w.t(), shared
    by the batch, or one transposed matrix per entry."""
    return torch.randn(32, 128).t() if shared else torch.randn(4, 32, 128).transpose(1, 2)


@pytest.mark.parametrize("shared", [True, False], ids=["shared-b", "per-entry-b"])
def test_batches_report_what_bmm_measured_and_ran(measured_mode, shared):
    """matmul of a 3-D a runs mm_variants::bmm, whose measured auto files the kernel it runs
    under its bucket; auto_choice and explain_auto name that kernel and that bucket."""
    a, b = torch.randn(4, 64, 128), batch_b(shared)
    out = mmv.matmul(a, b)
    [(bucket, ran)] = tuning.tuned_entries().items()
    assert mmv.explain_auto(a, b) == {"algorithm": ran, "reason": "cached", "bucket": bucket}
    assert mmv.auto_choice(a, b) == ran
    assert torch.equal(out, mmv.matmul(a, b, ran))


@pytest.mark.parametrize("shared", [True, False], ids=["shared-b", "per-entry-b"])
def test_batches_report_the_heuristic_choice_of_bmm(shared):
    """Against a shared b the contiguous batch is one product of its 256 rows, else auto chooses
    on an entry of 64."""
    a, b = torch.randn(4, 64, 128), batch_b(shared)
    decision = mmv.explain_auto(a, b)
    rows = 256 if shared else 64
    assert decision == {"algorithm": mmv.algorithms("cpu")[-1], "reason": "heuristic",
                        "bucket": f"{CPU}|Float|rc|{rows}x32x128"}
    assert mmv.auto_choice(a, b) == decision["algorithm"]
    assert torch.equal(mmv.matmul(a, b), mmv.matmul(a, b, decision["algorithm"]))


def nested(tensors):
    with warnings.catch_warnings():  # "nested tensors are in prototype stage"
        warnings.simplefilter("ignore")
        return torch.nested.nested_tensor(tensors)


@pytest.mark.parametrize("a,b", [
    (torch.randn(2, 3, 4), torch.randn(3, 4, 5)),
    (torch.randn(2, 3, 4), torch.randn(2, 5, 6)),
    (torch.randn(2, 3, 4), torch.randn(4)),
    (torch.randn(0, 3, 4), torch.randn(0, 4, 5, dtype=torch.float64)),
    (torch.randn(2, 3, 4), torch.randn(4, 5, dtype=torch.float64)),
    (torch.zeros(2, 3, 4, dtype=torch.int64), torch.zeros(4, 5, dtype=torch.int64)),
    (torch.randn(2, 2, 3, 4), torch.randn(4, 5)),
    (torch.randn(3, 4), torch.randn(5, 6)),
    (nested([torch.randn(3, 4), torch.randn(2, 4)]), torch.randn(4, 5)),
    (torch.randn(3, 4), nested([torch.randn(4, 5), torch.randn(4, 2)])),
], ids=["batch-sizes", "inner-sizes", "1-D-b", "empty-batch-dtypes", "dtypes", "int64", "4-D-a",
        "2-D-shapes", "nested-a", "nested-b"])
def test_refusals_are_matmuls(a, b):
    """explain_auto and auto_choice refuse what mmv.matmul refuses, with its message."""
    with pytest.raises(RuntimeError) as refused:
        mmv.matmul(a, b)
    message = str(refused.value).splitlines()[0]
    for explain in (mmv.explain_auto, mmv.auto_choice):
        with pytest.raises(RuntimeError) as explained:
            explain(a, b)
        assert str(explained.value).splitlines()[0] == message
