"""The source distribution holds everything a build needs, on a CPU or a CUDA machine, and an
import whose compiled extension is missing or does not load says what to do."""
from __future__ import annotations

import importlib.machinery
import os
import pathlib
import subprocess
import sys
import tarfile

import torch

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_sdist_holds_every_source_and_header(tmp_path):
    # A fresh egg-info: setuptools would otherwise reuse the file list of an earlier build's.
    egg_base, dist = tmp_path / "egg", tmp_path / "dist"
    egg_base.mkdir()
    subprocess.run([sys.executable, "setup.py", "-q", "egg_info", "--egg-base", str(egg_base),
                    "sdist", "-d", str(dist)], cwd=ROOT, check=True, capture_output=True,
                   timeout=300)
    (archive,) = dist.glob("*.tar.gz")
    with tarfile.open(archive) as tar:
        members = {name.split("/", 1)[1] for name in tar.getnames() if "/" in name}
    sources = {str(p.relative_to(ROOT)) for p in (ROOT / "torch_mm_variants" / "csrc").rglob("*")
               if p.suffix in {".h", ".cpp", ".cuh", ".cu"}}
    assert sources and sources <= members, sorted(sources - members)
    assert {"setup.py", "pyproject.toml", "tests/conftest.py"} <= members
    # What the README links to or names, beside the code.
    assert {"docs/sweep_h100_bf16.csv", "docs/sweep_h100_bf16.png", ".ci/run"} <= members


def import_error_of_copy(tmp_path, extension: bytes | None) -> str:
    """The error of importing a copy of the package's Python files, with `extension` as its
    compiled extension's file (None: none), in a child process that sees only that copy."""
    package = tmp_path / "torch_mm_variants"
    package.mkdir()
    for source in (ROOT / "torch_mm_variants").glob("*.py"):
        (package / source.name).write_text(source.read_text())
    if extension is not None:
        (package / f"_C{importlib.machinery.EXTENSION_SUFFIXES[0]}").write_bytes(extension)
    child = subprocess.run([sys.executable, "-c", "import torch_mm_variants"], cwd=tmp_path,
                           env={**os.environ, "PYTHONPATH": str(tmp_path)}, capture_output=True,
                           text=True, timeout=300)
    assert child.returncode != 0
    return child.stderr.strip().splitlines()[-1]


def test_import_says_the_extension_is_not_built(tmp_path):
    message = import_error_of_copy(tmp_path, None)
    assert message.startswith("ImportError: torch_mm_variants: the compiled extension")
    assert "is not built" in message and "build_ext --inplace" in message


def test_import_says_an_extension_that_does_not_load_needs_this_torch(tmp_path):
    """An extension that does not load (built against another torch: undefined symbols; here a
    file that is no library at all) is named with the torch it must be built against."""
    message = import_error_of_copy(tmp_path, b"not a shared library")
    assert f"does not load with torch {torch.__version__}" in message
    assert "build it again" in message and "The loader said:" in message
