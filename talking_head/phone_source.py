"""Where the talking head's phone timings come from: the TTS that spoke the audio, else the aligner.

The mouth takes viseme shapes only when it knows which phone is spoken when. The pack's own speech
carries its phones (TRT_TTS's side channel, audio/phone_channel.py); for any other audio (a user's
recording, a clip from elsewhere) the offline aligner (audio/phone_align.py, pocketsphinx's US-English
model) recovers them: forced alignment when the transcript is given, its phone loop otherwise. When
that is not possible (pocketsphinx not installed, Mandarin or another language, silence, low
confidence) the mouth keeps the audio-feature drive, and the note says why: the fallback is announced,
never silent.

Modes (the `visemes` input of the talking-head nodes and of `digital-human animate`):
  auto      the TTS's phones, else the aligner's
  tts-only  the TTS's phones only (other audio keeps the audio features; for recordings in a language
            the aligner does not know, which it cannot tell from the audio)
  off       no visemes
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Sequence

log = logging.getLogger("digital_human")

VISEME_MODES = ("auto", "tts-only", "off")


@dataclass(frozen=True)
class PhoneSource:
    phones: list | None  # (phone, start_s, end_s[, confidence]) or None: the audio features drive the mouth
    note: str            # one line for the node/CLI report: where the phones came from, or why none


def speech_phones(carried: Sequence[Any] | None, wave: Any, sample_rate: int, mode: str = "auto",
                  transcript: str | None = None, language: str = "en", model_reads_phones: bool = True
                  ) -> PhoneSource:
    """Phone timings for the talking head: `carried` (the TTS's) when present, else (mode auto) the
    aligner's on `wave`; None with the reason when neither is available. A model that does not read
    phones (model_reads_phones False) gets the carried ones at most: aligning for it would be wasted."""
    if mode not in VISEME_MODES:
        raise ValueError(f"visemes must be one of {', '.join(VISEME_MODES)}, got {mode!r}")
    if not model_reads_phones:
        return PhoneSource(list(carried) if carried else None, "")
    if mode == "off":
        return PhoneSource(None, "")  # the user's choice: nothing to explain
    if carried:
        return PhoneSource(list(carried), f"visemes from the TTS's phone timings ({len(carried)} phones)")
    if mode == "tts-only":
        return PhoneSource(None, "no phone timings with this audio (visemes tts-only): the mouth follows the "
                                 "audio features")
    from ..audio.phone_align import align_phones
    from .audio_features import to_mono

    result = align_phones(to_mono(wave), int(sample_rate), text=transcript, language=language)
    if not result.ok:
        note = f"no phone timings ({result.reason}): the mouth follows the audio features"
        log.info("visemes: %s", note)
        return PhoneSource(None, note)
    phones = [(p.label, p.start, p.end, result.confidence) for p in result.phones]
    how = "forced alignment to the transcript" if result.method == "forced" else "phone recognition (no transcript)"
    note = (f"visemes from the aligner: {how}, {sum(p[0] != 'SIL' for p in phones)} phones, "
            f"confidence {result.confidence:.2f}" + (f"; {result.reason}" if result.reason else ""))
    log.info("visemes: %s", note)
    return PhoneSource(phones, note)
