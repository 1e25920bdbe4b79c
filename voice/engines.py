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
import logging
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Protocol

import numpy as np

from ..fast_path import COSYVOICE_COST, COSYVOICE_FAST_ENV
from .speaker import SpeakerProfile


@dataclass(frozen=True)
class EngineEntry:
    """One TTS engine: where its class is and what it needs before it can run."""

    factory: str                   # "module:attribute" of its class; imported only when the engine is used
    extra: str = ""                # pyproject extra installing its Python dependencies ("" = core install)
    modules: tuple[str, ...] = ()  # top-level modules that extra provides (found without importing them)
    # "module:function" of a light check (no torch/transformers import) -> None when the files are in
    # place, else a message naming every missing file and where it goes; "" = nothing for the user to place
    files: str = ""
    # the factory's keyword that switches its CUDA fast path (CosyVoice2Engine(fast=True)) and the variable
    # that overrides the user's switch (fast_path.py); "" = the engine has none
    fast_keyword: str = ""
    fast_env: str = ""
    fast_cost: str = ""            # the first-use cost, for the tooltip and the log
    instruct: bool = False         # synthesize/stream take `instruction=` (speaking style / dialect)
    # "module:function" -> (engine name, why) or (None, every problem): a choice that runs another entry,
    # picked from the files in place (light, like `files`); "" = the entry is an engine itself
    picks: str = ""


ENGINES: dict[str, EngineEntry | str] = {  # a plain "module:attribute" string = an entry with no extra
    "kokoro": EngineEntry("digital_human.voice.kokoro_engine:KokoroEngine"),
    "cosyvoice2": EngineEntry("digital_human.engines.cosyvoice.engine:CosyVoice2Engine", extra="cosyvoice",
                              modules=("transformers", "yaml"),
                              files="digital_human.engines.cosyvoice.files:files_problem",
                              fast_keyword="fast", fast_env=COSYVOICE_FAST_ENV, fast_cost=COSYVOICE_COST),
    "cosyvoice3": EngineEntry("digital_human.engines.cosyvoice.engine3:CosyVoice3Engine", extra="cosyvoice",
                              modules=("transformers", "yaml"),
                              files="digital_human.engines.cosyvoice.files3:files_problem",
                              fast_keyword="fast", fast_env=COSYVOICE_FAST_ENV, fast_cost=COSYVOICE_COST,
                              instruct=True),
    # the folder in place decides: cosyvoice3 when Fun-CosyVoice3-0.5B is complete, else cosyvoice2
    "cosyvoice-auto": EngineEntry("", extra="cosyvoice", modules=("transformers", "yaml"),
                                  files="digital_human.engines.cosyvoice.choice:files_problem",
                                  fast_keyword="fast", fast_env=COSYVOICE_FAST_ENV, fast_cost=COSYVOICE_COST,
                                  picks="digital_human.engines.cosyvoice.choice:choose"),
}
DEFAULT_ENGINE = "kokoro"
log = logging.getLogger("digital_human")


def engine_entry(name: str) -> EngineEntry | None:
    """The registry entry of `name` (a plain factory string counts as an entry that needs nothing)."""
    entry = ENGINES.get(name)
    return EngineEntry(entry) if isinstance(entry, str) else entry


def _attribute(path: str) -> Any:
    module, attr = path.split(":")
    module = module.replace("digital_human", __package__.rsplit(".", 1)[0], 1)  # the pack's own import name
    return getattr(importlib.import_module(module), attr)


def engine_options(name: str, fast_path: bool | None = None) -> dict[str, Any]:
    """get_engine's options for the user's fast-path switch (its variable, 1 or 0, overrides it): the fast
    path and the CUDA device it runs on, when the engine has one and CUDA is usable; else {} (as before).
    The first-use cost is logged when it is switched on."""
    from ..fast_path import announce, switch

    entry = engine_entry(name)
    if entry is None or not entry.fast_keyword or not switch(fast_path, entry.fast_env):
        return {}
    from ..engines.devices import torch_cuda_usable

    if not torch_cuda_usable():
        log.warning("[digital_human] %s fast path asked for, but it needs a CUDA GPU: running eager on the CPU", name)
        return {}
    announce(name, entry.fast_cost)
    return {entry.fast_keyword: True, "device": "cuda"}


def fast_path_on_cuda(name: str, fast_path: bool | None = None) -> bool:
    """Whether engine_options(name, fast_path) would put the engine on a CUDA GPU (its fast path switched on and
    CUDA usable). Logs nothing and loads no model: for checks made before any work (serve's --tts-lanes)."""
    from ..fast_path import switch

    entry = engine_entry(name)
    if entry is None or not entry.fast_keyword or not switch(fast_path, entry.fast_env):
        return False
    from ..engines.devices import torch_cuda_usable

    return bool(torch_cuda_usable())


def engine_problem(name: str) -> str | None:
    """None when engine `name` can run now; else one message naming its missing extra (with the pip line)
    and every missing file. Quick: nothing heavy is imported (checked before any work starts)."""
    from ..optional_parts import extra_problem, join_problems

    entry = engine_entry(name)
    if entry is None:
        return f"unknown TTS engine '{name}'; choose one of {sorted(ENGINES)}"
    files_check: Callable[[], str | None] | None = _attribute(entry.files) if entry.files else None
    return join_problems(extra_problem(f"TTS engine '{name}'", entry.extra, entry.modules),
                         files_check() if files_check else None)


def resolve_engine(name: str) -> tuple[str, str]:
    """(the engine that runs for choice `name`, why it was picked; "" for an engine named directly).
    A choice with nothing to pick raises FileNotFoundError naming every missing file. Light: no torch."""
    entry = engine_entry(name)
    if entry is None or not entry.picks:
        return name, ""
    picked, why = _attribute(entry.picks)()
    if picked is None:
        raise FileNotFoundError(why)
    return picked, why


def instruction_problem(name: str, instruction: str | None) -> str | None:
    """None when `instruction` is empty or engine `name` (a choice: the engine it picks now) takes one;
    else a message naming the engine. Light: checked before any work."""
    if not (instruction or "").strip():
        return None
    try:
        picked, _ = resolve_engine(name)
    except FileNotFoundError:
        return None  # nothing to run at all: engine_problem names the missing files
    entry = engine_entry(picked)
    if entry is not None and entry.instruct:
        return None
    via = f" (picked by {name})" if picked != name else ""
    takers = [n for n in ENGINES if engine_entry(n).instruct]
    return (f"instruction: the TTS engine '{picked}'{via} does not take speaking-style / dialect instructions; "
            f"only {', '.join(takers)} does (and cosyvoice-auto when it picks it). Clear the instruction or "
            f"choose engine {' / '.join(takers)}.")


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
    """The loaded engine `name`; a choice (cosyvoice-auto) loads the engine it picks and logs which
    (the engine's `.name` says it too)."""
    if name not in ENGINES:
        raise ValueError(f"unknown TTS engine '{name}'; choose one of {sorted(ENGINES)}")
    picked, why = resolve_engine(name)
    if picked != name:
        log.info("[digital_human] TTS engine %s -> %s: %s", name, picked, why)
        name = picked
    key = f"{name}|{sorted(options.items())}"
    if key not in _LOADED:
        _LOADED[key] = _attribute(engine_entry(name).factory)(**options)
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
