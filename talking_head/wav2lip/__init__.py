"""`wav2lip`: Wav2Lip (Rudrabha/Wav2Lip; personal / research / non-commercial use only) on the user's own
checkpoint (wav2lip.pth or wav2lip_gan.pth): a small GAN generator that redraws the lower half of a 96x96 face
box from 16 mel frames, fast enough for a CPU. The network and its files are in engines/wav2lip; this folder is
the talking-head side (the reference's box padding, crop and paste geometry from FaceAlign's mesh, the
renderer). DIGITAL_HUMAN_WAV2LIP_CHECKPOINT=auto|wav2lip|wav2lip_gan picks the checkpoint (the contract has no
per-model input); auto takes the GAN one when both are there."""
from __future__ import annotations

from ..contract import TalkingHeadModel


def _generate(faces, wave, rate, fps, *, loop_mode, batch_size, strength, max_audio_seconds, backend, precision,
              avatar, progress, should_stop, streaming):
    from .crops import wav2lip_crops

    return wav2lip_crops(faces, wave, rate, fps, loop_mode=loop_mode, batch_size=batch_size, backend=backend,
                         precision=precision, max_audio_seconds=max_audio_seconds, progress=progress,
                         should_stop=should_stop, streaming=streaming)


def _problem(model: str) -> str | None:
    from ...engines.wav2lip.files import Wav2LipFilesError, locate

    try:
        locate()
    except (Wav2LipFilesError, ValueError) as exc:
        return str(exc)
    return None


MODEL = TalkingHeadModel(
    name="wav2lip", summary="Wav2Lip from the checkpoint you placed (personal / research / non-commercial use only)",
    needs="wav2lip.pth or wav2lip_gan.pth (Rudrabha/Wav2Lip release) under models/digital_human/wav2lip/",
    speech_features="80-band mel spectrogram (80 frames/s), a 16-frame window per video frame "
                    "(engines/wav2lip/audio.py)",
    crop_size="96x96 (Wav2Lip's padded face box, from FaceAlign's mesh), warped into the aligned crop",
    generate=_generate, problem=_problem)  # no pip extra: torch and OpenCV are base requirements
