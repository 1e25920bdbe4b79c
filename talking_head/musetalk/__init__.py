"""`musetalk`: MuseTalk 1.5 (TMElyralab, MIT) on the user's own release files: a one-step latent
UNet that redraws the lower half of a 256x256 face crop from whisper-tiny speech features. The
networks and their files are in engines/musetalk; this folder is the talking-head side (MuseTalk's
face box and crop conventions, blending, the per-frame renderer). The paste mask is MuseTalk's own
(BiSeNet face parsing) when the optional face-parse-bisent/79999_iter.pth is placed, else the face
mesh's; DIGITAL_HUMAN_MUSETALK_MASK=auto|mesh|face-parsing picks (the contract has no per-model input)."""
from __future__ import annotations

from ..contract import TalkingHeadModel


def _generate(faces, wave, rate, fps, *, loop_mode, batch_size, strength, max_audio_seconds, backend, precision,
              avatar, progress, should_stop, streaming, fast_path=None):
    from ...fast_path import MUSETALK_COMPILE_ENV, MUSETALK_COST, announce, switch
    from .crops import musetalk_crops

    compile = switch(fast_path, MUSETALK_COMPILE_ENV)  # the variable (1/0) overrides the switch
    if compile:
        announce("musetalk", MUSETALK_COST)
    return musetalk_crops(faces, wave, rate, fps, loop_mode=loop_mode, batch_size=batch_size, backend=backend,
                          precision=precision, max_audio_seconds=max_audio_seconds, progress=progress,
                          should_stop=should_stop, streaming=streaming, compile=compile)


def _problem(model: str) -> str | None:
    from ...engines.musetalk.files import MuseTalkFilesError, locate

    try:
        locate()
    except MuseTalkFilesError as exc:
        return str(exc)
    return None


MODEL = TalkingHeadModel(
    name="musetalk", summary="MuseTalk 1.5 from the release files you placed (MIT; weights allow commercial use)",
    needs="the MuseTalk 1.5 release under models/digital_human/musetalk/ and `pip install .[musetalk]`; "
          "optionally its face-parse-bisent/ folder (BiSeNet paste mask; else the face mesh's)",
    speech_features="whisper-tiny encoder states, 10 windows per video frame (engines/musetalk/audio.py)",
    crop_size="256x256 (MuseTalk's face box, from FaceAlign's mesh)", generate=_generate, problem=_problem,
    extra="musetalk", modules=("diffusers", "transformers"), options=("fast_path",))
