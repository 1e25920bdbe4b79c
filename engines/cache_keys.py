"""Stable identities for loaded models and built engines.

A cached engine is only valid for the exact graph bytes, precision, shape profile, library version
and GPU architecture it was built for; all of them go into the key and the engine file name so a
mismatch means a different file (rebuild) rather than a silently wrong engine.
"""
from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

from ..assets.pypi_fetch import sha256_file
from .spec import ModelSpec

_HASH_MEMO: dict[tuple[str, int, int], str] = {}


def file_sha256(path: Path) -> str:
    """sha256 of a file, memoised by (path, size, mtime) so big graphs are hashed once per process."""
    stat = os.stat(path)
    memo_key = (str(Path(path).resolve()), stat.st_size, stat.st_mtime_ns)
    cached = _HASH_MEMO.get(memo_key)
    if cached:
        return cached
    _HASH_MEMO[memo_key] = sha256_file(Path(path))
    return _HASH_MEMO[memo_key]


def short(text: str, n: int = 12) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:n]


def runner_cache_key(spec: ModelSpec, backend: str, device: str, precision: str, lib_version: str) -> str:
    """Key of the loader's in-process cache."""
    graph = spec.cpu_onnx_path if (device == "cpu" and spec.cpu_onnx_path) else spec.onnx_path
    graph_hash = file_sha256(Path(graph))[:16] if Path(graph).is_file() else "missing"
    return "|".join([spec.name, graph_hash, backend, device, precision, spec.profile_key(), lib_version])


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text)


def engine_file_name(spec: ModelSpec, precision: str, trt_version: str, compute_capability: str) -> str:
    """e.g. `ge2e-3f2a9c0d11aa22bb-fp16-p1a2b3c4d5e6-trt10.3.0-sm90.engine`."""
    graph_hash = file_sha256(Path(spec.onnx_path))[:16]
    return (f"{_safe(spec.name)}-{graph_hash}-{precision}-p{short(spec.profile_key())}"
            f"-trt{_safe(trt_version)}-sm{_safe(compute_capability)}.engine")
