"""`portrait` with phone timings: viseme targets set the mouth's shape, the audio's energy its size.

speech_drive.mouth_params reads only loudness and spectral balance, so it cannot tell /p/ from /a/'s
onset or /u/ from a quiet /a/. When the speech comes with phone timings (the TTS's own, or an
aligner's) talking_head/visemes.py gives per-frame targets; this module merges the two:
  * jaw/lip opening = the viseme's opening scaled by how loud the frame is relative to the clip's
    loud speech (stressed syllables open wider; the viseme says how wide for this sound),
  * width/round = the viseme's (the spectral guess is what visemes replace),
  * lips meet on bilabial frames (closure), whatever the energy says,
  * where the track's confidence is low (an uncertain alignment) the result slides back to the
    audio-only parameters, frame by frame.
Without phone timings portrait does not call this module at all: its frames stay as they were.
"""
from __future__ import annotations

import numpy as np

from ..visemes import SILENCE, VisemeTrack
from .speech_drive import MouthParams, mouth_params

OPEN_GAIN = 1.6       # viseme openings x this before the energy scaling: on dev clip 01a MLD 0.0247 at 1.0, 0.0237 at 1.3, 0.0228 at 1.6 (RESULTS.md)
LOUD_PERCENTILE = 90  # the clip's "loud speech" opening, from frames the visemes call speech
ENERGY_FLOOR = 0.45   # share of a viseme's opening kept however quiet the frame (a whisper still shapes)
ENERGY_CEIL = 1.25    # louder than the clip's loud speech opens at most this much wider
CLOSURE_CONFIDENCE = 0.5  # a closure is forced fully from this confidence up (fades in below it)


def energy_gain(energy: MouthParams, track: VisemeTrack) -> np.ndarray:
    """Per-frame amplitude factor in ENERGY_FLOOR..ENERGY_CEIL from the audio-only jaw opening."""
    speech = track.viseme != SILENCE
    reference = energy.jaw_open[speech] if speech.any() else energy.jaw_open
    loud = float(np.percentile(reference, LOUD_PERCENTILE)) if reference.size else 0.0
    if loud < 1e-3:  # no audible speech where the phones are: trust the phones' openings as they are
        return np.ones(len(track), np.float32)
    rel = energy.jaw_open / loud
    return np.clip(ENERGY_FLOOR + (1.0 - ENERGY_FLOOR) * rel, 0.0, ENERGY_CEIL).astype(np.float32)


def blend(energy: MouthParams, track: VisemeTrack) -> MouthParams:
    """Viseme-shaped, energy-scaled mouth parameters; same frames and fps as `energy`."""
    if len(energy) != len(track):
        raise ValueError(f"{len(track)} viseme frames for {len(energy)} mouth frames")
    c = np.clip(track.confidence, 0.0, 1.0)
    gain = energy_gain(energy, track) * OPEN_GAIN

    def mix(viseme_value: np.ndarray, audio_value: np.ndarray) -> np.ndarray:
        return c * viseme_value + (1.0 - c) * audio_value

    jaw = mix(track.jaw_open * gain, energy.jaw_open)
    lip = mix(track.lip_open * gain, energy.lip_open)
    width = mix(track.width, energy.width)
    rnd = mix(track.round, energy.round)
    close = track.closure * np.clip(c / CLOSURE_CONFIDENCE, 0.0, 1.0)
    lip = lip * (1.0 - close)
    out = [np.clip(a, 0.0, 1.0).astype(np.float32) for a in (jaw, lip, width, rnd)]
    return MouthParams(*out, fps=energy.fps)


def speech_mouth(wave: np.ndarray, sample_rate: int, fps: float, n_frames: int,
                 track: VisemeTrack | None) -> MouthParams:
    """portrait's drive for `n_frames` frames: the audio-only parameters, blended with the viseme track
    when the speech's phones are known (None: audio only). `clone` avatars with mouth_drive read the same."""
    params = mouth_params(wave, sample_rate, fps, n_frames)
    return params if track is None else blend(params, track)
