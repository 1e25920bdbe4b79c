"""Phone timings riding along with a ComfyUI AUDIO: the optional key "dh_phones".

The pack's TTS knows which phone it spoke when (voice/phone_timing.py); the talking head needs that to
close the lips on p/b/m and round them on o/u/w. ComfyUI passes the AUDIO dict between nodes as is,
and nodes read only the keys they know, so an extra key is a side channel that needs no new socket:
TRT_TTS writes it, TRT_TalkingHead / TalkingHeadVideo read it when present. Audio from anywhere else
(a file, a recording) has no key and keeps today's behaviour.

Value: a list of (phone, start_s, end_s[, confidence]) for batch item 0, time-ordered, gaps = silence
(an aligner's phones carry its confidence; the TTS's do not). A node that
edits the audio but copies the dict would leave stale times behind; `phones_from_audio` drops them
when they run past the end of the waveform it came with.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

PHONES_KEY = "dh_phones"
PhoneTime = tuple  # (phone, start_s, end_s) or (phone, start_s, end_s, confidence)
END_SLACK_S = 0.05  # phones may end this much after the audio (rounding) and still be believed


def with_phones(audio: dict, phones: Sequence[PhoneTime] | None) -> dict:
    """`audio` with the side channel set (a no-op without phones)."""
    if phones:
        audio[PHONES_KEY] = [(str(p[0]), float(p[1]), float(p[2]), *(float(c) for c in p[3:4])) for p in phones]
    return audio


def _audio_seconds(audio: dict) -> float | None:
    wave, rate = audio.get("waveform"), audio.get("sample_rate")
    try:
        return float(wave.shape[-1]) / float(rate)
    except (AttributeError, TypeError, ValueError, ZeroDivisionError, IndexError):
        return None


def phones_from_audio(audio: Any) -> list[PhoneTime] | None:
    """The phone timings carried by an AUDIO dict, or None (absent, malformed or not matching it)."""
    if not isinstance(audio, dict) or not audio.get(PHONES_KEY):
        return None
    out: list[PhoneTime] = []
    last = -math.inf
    try:
        for item in audio[PHONES_KEY]:
            phone, start, end = str(item[0]), float(item[1]), float(item[2])
            if not (math.isfinite(start) and math.isfinite(end)) or end <= start or start < last - 1e-6:
                return None
            confidence = [float(c) for c in item[3:4]]
            if confidence and not 0.0 <= confidence[0] <= 1.0:
                return None
            out.append((phone, start, end, *confidence))
            last = start
    except (TypeError, ValueError, IndexError):
        return None
    seconds = _audio_seconds(audio)
    if seconds is None or not out or max(p[2] for p in out) > seconds + END_SLACK_S:
        return None
    return out
