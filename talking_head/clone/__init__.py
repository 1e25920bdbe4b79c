"""`clone:<avatar>`: a small generator trained per person by TrainAvatar (train.py) from a talking
video, stored as an avatar (avatar_store.py) and run through the engine loader (infer.py)."""
from __future__ import annotations

from ..contract import TalkingHeadModel


def _generate(faces, wave, rate, fps, *, loop_mode, batch_size, strength, max_audio_seconds, backend, precision,
              avatar, progress, should_stop, streaming, phones=None):
    from .infer import clone_crops

    return clone_crops(avatar, faces, wave, rate, fps, loop_mode=loop_mode, batch_size=batch_size, backend=backend,
                       precision=precision, max_audio_seconds=max_audio_seconds, progress=progress,
                       should_stop=should_stop, streaming=streaming, phones=phones)


def _reads_phones(avatar) -> bool:
    """Only avatars trained with visemes read phones (aligning speech for the others would be wasted)."""
    from .avatar_store import AvatarInfo, load_avatar

    try:
        info = avatar if isinstance(avatar, AvatarInfo) else load_avatar(str(avatar))
    except (OSError, ValueError):
        return False  # a missing avatar is reported by problem() / the generation itself
    return bool(info.generator_config.viseme_frames)


def _problem(model: str) -> str | None:
    from .avatar_store import avatars_root, list_avatars

    name = model.split(":", 1)[1] if ":" in model else ""
    if name in list_avatars():
        return None
    return (f"avatar '{name}' not found in {avatars_root()}; train it with TrainAvatar "
            "(or `digital-human train-avatar`) first")


MODEL = TalkingHeadModel(
    name="clone", summary="a generator trained on one person's talking video (TrainAvatar)",
    needs="an avatar trained by TrainAvatar", speech_features="log-mel windows (talking_head/audio_features.py)",
    crop_size="the avatar's crop size (set at training)", generate=_generate, problem=_problem, per_avatar=True,
    reads_phones=_reads_phones)
