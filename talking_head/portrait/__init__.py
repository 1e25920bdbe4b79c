"""`portrait`: zero-shot talking head for any photo or video, no weights (a mesh warp of the lips and
jaw driven by speech loudness and spectral shape, with a rendered mouth interior, or on a video
reference the person's own mouths from a mouth bank)."""
from __future__ import annotations

from ..contract import TalkingHeadModel


def _generate(faces, wave, rate, fps, *, loop_mode, batch_size, strength, max_audio_seconds, backend, precision,
              avatar, progress, should_stop, streaming, phones=None, mouth_bank="off"):
    from .animate import portrait_crops

    return portrait_crops(faces, wave, rate, fps, loop_mode=loop_mode, strength=strength,
                          max_audio_seconds=max_audio_seconds, batch_size=batch_size, progress=progress,
                          should_stop=should_stop, streaming=streaming, phones=phones, mouth_bank=mouth_bank)


MODEL = TalkingHeadModel(
    name="portrait", summary="zero-shot on any photo or video, no weights (warped lips and a drawn mouth)",
    needs="", speech_features="loudness and spectral shape per frame (speech_drive.py); with phone timings "
    "(TTS side channel) viseme shapes scaled by loudness (viseme_drive.py)",
    crop_size="the aligned crop (FaceAlign's crop_size; the CLI picks 512 px for large faces)", generate=_generate,
    reads_phones=True, adaptive_crop=True, options=("mouth_bank",))
