"""Phone timings of synthesized speech, from Kokoro's own duration predictor.

Kokoro reads one token per phoneme character and predicts how many frames (DURATION_HOP samples at
24 kHz) each token lasts; the audio is exactly those frames end to end. Not every token is a phone:
stress marks come before the vowel they stress, length and tone marks and diacritics after the
sound they modify, spaces sit between words and punctuation is a pause. This module turns the
token timeline into phones (symbol, start_s, end_s) in the TTS's own symbols (misaki/espeak-style
IPA, with Kokoro's one-letter diphthongs A I O W Y Q); talking_head/visemes.py maps them to mouths.
Gaps between phones are silence.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

PhoneTime = tuple[str, float, float]

# stress marks precede the syllable's vowel: their time belongs to what follows
LEADING_MARKS = frozenset("ˈˌ")
# length, tone (Mandarin arrows), aspiration/palatalisation/nasalisation: part of the sound before them
TRAILING_MARKS = frozenset("ː↓↗↘→ʰʲ̃")
# punctuation and quotes: Kokoro spends them as pauses (or not at all), the mouth rests
PAUSE_MARKS = frozenset(";:,.!?—…\"“”()'")
WORD_GAP = " "


def token_phones(tokens: Sequence[str], durations: np.ndarray, frame_s: float, offset_s: float = 0.0,
                 time_scale: float = 1.0, lead_s: float = 0.0) -> list[PhoneTime]:
    """Phones of one Kokoro call.

    tokens: the characters actually fed (after vocabulary filtering), N of them.
    durations: [N + 2] frames per token with the leading and trailing pad (graph order).
    frame_s: seconds per duration frame; offset_s: where this call's audio starts in the output;
    time_scale: output seconds per synthesized second (a formant shift that resamples the audio);
    lead_s: synthesized seconds by which the sounds precede the duration boundaries (the model's
    measured AUDIO_LEAD_S / speed); times never move before the call's own start.
    """
    dur = np.asarray(durations, np.float64).reshape(-1)
    if len(dur) != len(tokens) + 2:
        raise ValueError(f"{len(dur)} durations for {len(tokens)} tokens (+2 pads expected)")
    synth_edges = np.maximum(np.concatenate([[0.0], np.cumsum(dur)]) * frame_s - lead_s, 0.0)
    edges = synth_edges * time_scale + offset_s
    # token k (0-based in `tokens`) spans edges[k + 1] .. edges[k + 2]; the pads are silence
    phones: list[list] = []  # [symbol, start, end], mutable while marks and gaps are folded in
    carry_start: float | None = None  # a stress mark's start, given to the next phone
    pending_gap: tuple[float, float] | None = None  # a word gap waiting for the phone after it
    for k, tok in enumerate(tokens):
        start, end = float(edges[k + 1]), float(edges[k + 2])
        if tok in LEADING_MARKS:
            carry_start = start if carry_start is None else carry_start
        elif tok in TRAILING_MARKS:
            if phones and abs(phones[-1][2] - start) < 1e-9:
                phones[-1][2] = end
        elif tok == WORD_GAP:
            pending_gap = (start, end)
        elif tok in PAUSE_MARKS:
            carry_start, pending_gap = None, None
        else:
            begin = start if carry_start is None else carry_start
            if pending_gap is not None and phones and abs(phones[-1][2] - pending_gap[0]) < 1e-9:
                # between words in running speech there is no pause: the articulators glide, so the
                # space's frames are shared by the phones on either side
                mid = 0.5 * (pending_gap[0] + pending_gap[1])
                phones[-1][2] = mid
                begin = min(begin, mid)
            elif pending_gap is not None and carry_start is None:
                begin = min(begin, pending_gap[1])
            phones.append([tok, begin, end])
            carry_start, pending_gap = None, None
    return [(str(s), round(float(a), 6), round(float(b), 6)) for s, a, b in phones if b > a]
