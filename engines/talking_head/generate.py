"""One entry point for "the talking-head model's crops for every output frame", whichever model:
`portrait` (zero-shot) or `clone:<avatar name>` / a DH_AVATAR. Used by TRT_TalkingHead,
TalkingHeadVideo, the CLI and the benchmarks, so they all run the same dispatch."""
from __future__ import annotations

from typing import Any, Callable

from .driver import GeneratedCrops


def generate_crops(faces: Any, wave: Any, rate: int, model: str, fps: float, loop_mode: str = "ping-pong",
                   batch_size: int = 0, strength: float = 1.0, max_audio_seconds: float = 600.0,
                   backend: str = "auto", precision: str = "auto", avatar: Any = None,
                   progress: Callable[[int, int], None] | None = None,
                   should_stop: Callable[[], bool] | None = None, streaming: bool = False) -> GeneratedCrops:
    """The model's crops for every output frame, for `portrait` or `clone:<name>` / an avatar.
    streaming: crops are made on demand while the video is rendered (bounded memory); progress then
    reports nothing here (the renderer reports)."""
    if avatar is not None or model.startswith("clone:"):
        from .clone_infer import clone_crops

        return clone_crops(avatar if avatar is not None else model.split(":", 1)[1], faces, wave, rate, fps,
                           loop_mode=loop_mode, batch_size=batch_size, backend=backend, precision=precision,
                           max_audio_seconds=max_audio_seconds, progress=progress, should_stop=should_stop,
                           streaming=streaming)
    if model == "portrait":
        from .portrait import portrait_crops

        return portrait_crops(faces, wave, rate, fps, loop_mode=loop_mode, strength=strength,
                              max_audio_seconds=max_audio_seconds, batch_size=batch_size, progress=progress,
                              should_stop=should_stop, streaming=streaming)
    raise ValueError(f"model must be 'portrait' or 'clone:<avatar name>', got '{model}'")
