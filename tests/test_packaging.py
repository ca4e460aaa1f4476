"""The source distribution holds everything a build needs, on a CPU or a CUDA machine."""
from __future__ import annotations

import pathlib
import subprocess
import sys
import tarfile

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
