"""One entry point for "the talking-head model's crops for every output frame", whichever model:
`portrait` (zero-shot), `musetalk` (the user's MuseTalk 1.5 release) or `clone:<avatar name>` / a
DH_AVATAR. Used by TRT_TalkingHead, TalkingHeadVideo, the CLI and the benchmarks, so they all run the
same dispatch. A model is one entry in MODELS: a function with generate_crops' arguments."""
from __future__ import annotations

from typing import Any, Callable

from .driver import GeneratedCrops


def _portrait(faces, wave, rate, fps, *, loop_mode, batch_size, strength, max_audio_seconds, backend, precision,
              avatar, progress, should_stop, streaming) -> GeneratedCrops:
    from .portrait import portrait_crops

    return portrait_crops(faces, wave, rate, fps, loop_mode=loop_mode, strength=strength,
                          max_audio_seconds=max_audio_seconds, batch_size=batch_size, progress=progress,
                          should_stop=should_stop, streaming=streaming)


def _musetalk(faces, wave, rate, fps, *, loop_mode, batch_size, strength, max_audio_seconds, backend, precision,
              avatar, progress, should_stop, streaming) -> GeneratedCrops:
    from ..musetalk.talking_head import musetalk_crops

    return musetalk_crops(faces, wave, rate, fps, loop_mode=loop_mode, batch_size=batch_size, backend=backend,
                          precision=precision, max_audio_seconds=max_audio_seconds, progress=progress,
                          should_stop=should_stop, streaming=streaming)


def _clone(faces, wave, rate, fps, *, loop_mode, batch_size, strength, max_audio_seconds, backend, precision,
           avatar, progress, should_stop, streaming) -> GeneratedCrops:
    from .clone_infer import clone_crops

    return clone_crops(avatar, faces, wave, rate, fps, loop_mode=loop_mode, batch_size=batch_size, backend=backend,
                       precision=precision, max_audio_seconds=max_audio_seconds, progress=progress,
                       should_stop=should_stop, streaming=streaming)


# model name -> its generator; `clone` takes an avatar (a DH_AVATAR input or `clone:<name>`)
MODELS: dict[str, Callable[..., GeneratedCrops]] = {"portrait": _portrait, "musetalk": _musetalk, "clone": _clone}


def generate_crops(faces: Any, wave: Any, rate: int, model: str, fps: float, loop_mode: str = "ping-pong",
                   batch_size: int = 0, strength: float = 1.0, max_audio_seconds: float = 600.0,
                   backend: str = "auto", precision: str = "auto", avatar: Any = None,
                   progress: Callable[[int, int], None] | None = None,
                   should_stop: Callable[[], bool] | None = None, streaming: bool = False) -> GeneratedCrops:
    """The model's crops for every output frame (see MODELS).
    streaming: crops are made on demand while the video is rendered (bounded memory); progress then
    reports nothing here (the renderer reports)."""
    name = model
    if avatar is not None or model.startswith("clone:"):
        name, avatar = "clone", avatar if avatar is not None else model.split(":", 1)[1]
    if name not in MODELS:
        raise ValueError(f"model must be one of {', '.join(m for m in MODELS if m != 'clone')} or "
                         f"'clone:<avatar name>', got '{model}'")
    return MODELS[name](faces, wave, rate, fps, loop_mode=loop_mode, batch_size=batch_size, strength=strength,
                        max_audio_seconds=max_audio_seconds, backend=backend, precision=precision, avatar=avatar,
                        progress=progress, should_stop=should_stop, streaming=streaming)
