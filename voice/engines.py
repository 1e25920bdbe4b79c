"""TTS engine protocol and registry (DESIGN 5b): one folder per engine, one line here.

    engine = get_engine("cosyvoice2")
    speaker = engine.prepare_speaker(prepared_audio, transcript, speaker)   # state kept in DH_SPEAKER
    result = engine.synthesize(text, speaker, language="auto", speed=1.0, seed=0)   # SpeechResult
    for piece in engine.stream(text, speaker, ...): ...                     # float32 chunks

Engine state lives in `SpeakerProfile.extras` under "<engine name>/<key>" (plain arrays), so it is
saved and loaded with the speaker file. Nodes, CLI and benchmarks list engines from ENGINES.
"""
from __future__ import annotations

import importlib
from typing import Any, Iterator, Protocol

import numpy as np

from .speaker import SpeakerProfile

# name -> "module:attribute" of a zero-argument factory; imported only when the engine is used.
ENGINES: dict[str, str] = {
    "kokoro": "digital_human.voice.kokoro_engine:KokoroEngine",
    "cosyvoice2": "digital_human.engines.cosyvoice.engine:CosyVoice2Engine",
    "cosyvoice3": "digital_human.engines.cosyvoice.engine3:CosyVoice3Engine",
}
DEFAULT_ENGINE = "kokoro"


class TTSEngine(Protocol):
    name: str
    sample_rate: int

    def check_files(self) -> None: ...

    def prepare_speaker(self, prepared: Any, transcript: str = "",
                        speaker: SpeakerProfile | None = None, **options: Any) -> SpeakerProfile: ...

    def synthesize(self, text: str, speaker: SpeakerProfile | None, language: str = "auto", speed: float = 1.0,
                   seed: int = 0, **options: Any) -> Any: ...

    def stream(self, text: str, speaker: SpeakerProfile | None, language: str = "auto", speed: float = 1.0,
               seed: int = 0, **options: Any) -> Iterator[np.ndarray]: ...


_LOADED: dict[str, TTSEngine] = {}


def get_engine(name: str = DEFAULT_ENGINE, **options: Any) -> TTSEngine:
    if name not in ENGINES:
        raise ValueError(f"unknown TTS engine '{name}'; choose one of {sorted(ENGINES)}")
    key = f"{name}|{sorted(options.items())}"
    if key not in _LOADED:
        module, attr = ENGINES[name].split(":")
        module = module.replace("digital_human", __package__.rsplit(".", 1)[0], 1)
        _LOADED[key] = getattr(importlib.import_module(module), attr)(**options)
    return _LOADED[key]


def engine_state(speaker: SpeakerProfile | None, engine: str) -> dict[str, np.ndarray]:
    """The arrays an engine stored on the speaker (keys without the engine prefix)."""
    if speaker is None:
        return {}
    prefix = engine + "/"
    return {k[len(prefix):]: v for k, v in speaker.extras.items() if k.startswith(prefix)}


def with_engine_state(speaker: SpeakerProfile, engine: str, state: dict[str, np.ndarray]) -> SpeakerProfile:
    out = speaker.copy()
    out.extras = {k: v for k, v in out.extras.items() if not k.startswith(engine + "/")}
    out.extras.update({f"{engine}/{k}": np.asarray(v) for k, v in state.items()})
    return out


def cosyvoice_engine_for(folder: Any) -> str:
    """The engine that runs a CosyVoice release folder ('cosyvoice3' or 'cosyvoice2'), told from its files
    (cosyvoice3.yaml / speech_tokenizer_v3.onnx vs cosyvoice2.yaml / speech_tokenizer_v2.onnx): the `auto`
    choice, so a folder is never handed to the engine of the other version."""
    module = importlib.import_module(__package__.rsplit(".", 1)[0] + ".engines.cosyvoice.release3")
    return module.engine_for_folder(folder)
