"""The wheel built from the repository holds every package and the bundled workflows/js (issue 13: a
hand-written package list once left out engines/talking_head, so `pip install .` broke animate/run)."""
from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOT_SHIPPED = {"tests", "benchmarks"}  # development only
# build outputs, caches, virtual environments and model folders the repository may hold (see .gitignore)
_NOT_COPIED = (".git", "__pycache__", "build", "dist", "*.egg-info", ".pytest_cache", ".ci-venv", ".ci-models",
               "models", "output", "out", ".whl", ".gl", ".carry*", "artifacts")


def _packages_in_tree() -> set[str]:
    found = set()
    for init in ROOT.rglob("__init__.py"):
        parts = init.parent.relative_to(ROOT).parts
        if parts and (parts[0] in NOT_SHIPPED or parts[0].startswith(".")):
            continue
        if any(p in {"__pycache__", "build"} or p.endswith(".egg-info") for p in parts):
            continue
        found.add(".".join(("digital_human", *parts)))
    return found


def test_wheel_contains_every_package_and_the_bundled_files(tmp_path):
    setuptools = pytest.importorskip("setuptools")
    if int(setuptools.__version__.split(".")[0]) < 77:
        pytest.skip(f"setuptools {setuptools.__version__} < 77 (the build-system floor)")
    # pip builds in the source tree (build/, *.egg-info): build a copy, so the repository stays untouched;
    # --no-build-isolation: no network needed
    source = tmp_path / "src"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(*_NOT_COPIED))
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                           "-w", str(tmp_path / "dist"), str(source)], capture_output=True, text=True, timeout=600,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    wheel = next((tmp_path / "dist").glob("comfyui_digital_human-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = {n.rsplit("/", 1)[0].replace("/", ".") for n in names if n.endswith("/__init__.py")}
    expected = _packages_in_tree()
    assert "digital_human.talking_head" in expected
    assert expected <= shipped, f"missing from the wheel: {sorted(expected - shipped)}"
    assert not {n for n in names if n.startswith(("digital_human/tests/", "digital_human/benchmarks/"))}
    for folder, pattern in [("workflows/api", "*.json"), ("example_workflows", "*"), ("js", "*.js")]:
        files = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / folder).glob(pattern) if p.is_file())
        assert files, folder
        missing = [f for f in files if f"digital_human/{f}" not in names]
        assert not missing, f"missing from the wheel: {missing}"
    assert "digital_human/cli.py" in names and "digital_human/preflight.py" in names
    metadata = next(n for n in names if n.endswith(".dist-info/METADATA"))
    text = zipfile.ZipFile(wheel).read(metadata).decode()
    assert "License-Expression: Apache-2.0" in text
