"""The talking-head models, one line each. Adding a model is one folder (with a `MODEL` meeting
contract.TalkingHeadModel) plus one line in MODELS; TRT_TalkingHead, TalkingHeadVideo, the CLI's
`--model` checks and the benchmarks all read this registry."""
from __future__ import annotations

from typing import Any, Callable

from . import clone, latentsync, musetalk, portrait, sonic, wav2lip
from .contract import TalkingHeadModel
from .driver import GeneratedCrops, GeneratedFrames

MODELS: dict[str, TalkingHeadModel] = {
    "portrait": portrait.MODEL,
    "musetalk": musetalk.MODEL,
    "clone": clone.MODEL,
    "wav2lip": wav2lip.MODEL,
    "sonic": sonic.MODEL,
    "latentsync": latentsync.MODEL,
}


class UnknownModelError(ValueError):
    pass


def resolve(model: str, avatar: Any = None) -> tuple[TalkingHeadModel, Any]:
    """The registry entry for a `model` value, and the avatar it names (`clone:<name>`) or was given."""
    name, _, suffix = model.partition(":")
    entry = MODELS.get(name if avatar is None else "clone")
    if entry is None or (entry.per_avatar and avatar is None and not suffix) or (suffix and not entry.per_avatar):
        raise UnknownModelError(f"model must be {' or '.join(choice_patterns())}, got '{model}'")
    return entry, avatar if avatar is not None else (suffix or None)


def _entry_reads_phones(entry: TalkingHeadModel, avatar: Any) -> bool:
    return bool(entry.reads_phones(avatar)) if callable(entry.reads_phones) else bool(entry.reads_phones)


def reads_phones(model: str, avatar: Any = None) -> bool:
    """Whether `model` (or the given DH_AVATAR) reads phone timings, so the aligner is worth running."""
    entry, avatar = resolve(model, avatar)
    return _entry_reads_phones(entry, avatar)


def choice_patterns() -> list[str]:
    """How each model is written: 'portrait', 'musetalk', 'clone:<avatar name>'."""
    return [f"'{m.name}:<avatar name>'" if m.per_avatar else f"'{m.name}'" for m in MODELS.values()]


def model_choices() -> list[str]:
    """Every `model` value that exists now, for menus: one entry per trained avatar for per-avatar models."""
    from .clone.avatar_store import list_avatars

    choices: list[str] = []
    for entry in MODELS.values():
        choices += [f"{entry.name}:{a}" for a in list_avatars()] if entry.per_avatar else [entry.name]
    return choices


def model_problem(model: str) -> str | None:
    """None when `model` can run now; else what is missing: its pip extra (with the line that installs
    it) and every missing file and where it goes, in one message (unknown names included). Imports
    nothing heavy: the extra's modules are found without importing them (optional_parts.py)."""
    from ..optional_parts import extra_problem, join_problems

    try:
        entry, _ = resolve(model)
    except UnknownModelError as exc:
        return str(exc)
    return join_problems(extra_problem(f"model '{entry.name}'", entry.extra, entry.modules), entry.problem(model))


def generate_crops(faces: Any, wave: Any, rate: int, model: str, fps: float, loop_mode: str = "ping-pong",
                   batch_size: int = 0, strength: float = 1.0, max_audio_seconds: float = 600.0,
                   backend: str = "auto", precision: str = "auto", avatar: Any = None,
                   progress: Callable[[int, int], None] | None = None,
                   should_stop: Callable[[], bool] | None = None, streaming: bool = False,
                   phones: Any = None, idle_motion: bool = False, seed: int = 0,
                   mouth_bank: Any = None, fast_path: bool | None = None,
                   settings: dict[str, Any] | None = None) -> "GeneratedCrops | GeneratedFrames":
    """The model's crops for every output frame. A given `avatar` (DH_AVATAR) overrides `model`.
    streaming: crops are made on demand while the video is rendered (bounded memory); progress then
    reports nothing here (the renderer reports). phones: the speech's phone timings, or None; given
    only to models that read them (TalkingHeadModel.reads_phones). idle_motion: a photo blinks, sways and
    nods with the speech (head_warp.py, any model; seeded by `seed`); a video reference keeps its own motion.
    mouth_bank: portrait's mouth bank ("auto", "off", or a FaceTrack of another video of the person;
    None = the model's default); other models ignore it. fast_path: the model's compiled / CUDA-graph path
    (models with "fast_path" in their options, e.g. musetalk; None = its default, or its variable).
    settings: model settings by name (e.g. steps, seed, vram), given only to models that list them in `options`. A whole-frame model (contract kind) returns
    GeneratedFrames and gets no idle motion (it moves the head itself)."""
    entry, avatar = resolve(model, avatar)
    extra = {"phones": phones} if phones and _entry_reads_phones(entry, avatar) else {}
    if mouth_bank is not None and "mouth_bank" in entry.options:
        extra["mouth_bank"] = mouth_bank
    if fast_path is not None and "fast_path" in entry.options:
        extra["fast_path"] = bool(fast_path)
    for key, value in (settings or {}).items():
        if key in entry.options and value is not None:
            extra[key] = value
    gen = entry.generate(faces, wave, rate, fps, loop_mode=loop_mode, batch_size=batch_size, strength=strength,
                         max_audio_seconds=max_audio_seconds, backend=backend, precision=precision, avatar=avatar,
                         progress=progress, should_stop=should_stop, streaming=streaming, **extra)
    if not idle_motion or entry.kind == "whole-frame":
        return gen
    from .driver import validate_audio
    from .head_warp import attach_idle_motion

    return attach_idle_motion(gen, validate_audio(wave, rate, max_audio_seconds), rate, seed)


def model_kind(model: str) -> str:
    """The contract kind of `model`: "mouth-crop" or "whole-frame"."""
    return resolve(model)[0].kind


def model_options(model: str) -> tuple[str, ...]:
    """The settings `model` reads (generate_crops' `settings` keys)."""
    return resolve(model)[0].options
