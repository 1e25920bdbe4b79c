"""The `visemes` input of a viseme avatar, per output frame, built the same way for training and inference.

Per frame: the viseme track's six features (talking_head/visemes.FEATURE_NAMES; zeros, confidence 0,
where no phones are known) and, for a `mouth_drive` config, portrait's four mouth parameters for the
same speech (portrait/viseme_drive.speech_mouth: audio-only where no phones are known). The window of
`viseme_frames` frames around each frame is flattened as visemes.feature_windows does.

Why portrait's drive: it is a rule-based mapping from loudness, spectral balance and phones to mouth
opening, normalised to each clip's own loud speech, so it does not depend on which words the footage
happened to contain; a generator that reads it next to the mel window has a speaker-independent
mouth-size signal that 25 s of one person's footage cannot overfit.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ...engines.clone_model import GeneratorConfig
from ..portrait.viseme_drive import speech_mouth
from ..visemes import feature_windows, frame_features, viseme_track


def frame_conditioning(phones: Sequence[Any] | None, wave: np.ndarray, sample_rate: int, fps: float,
                       n_frames: int, mouth_drive: bool) -> np.ndarray:
    """float32 [n_frames, 6 (+4 with mouth_drive)] per-frame features of mono `wave`'s speech."""
    track = viseme_track(phones, fps, n_frames) if phones else None
    features = frame_features(track, n_frames)
    if not mouth_drive:
        return features
    drive = speech_mouth(np.asarray(wave, np.float32), int(sample_rate), fps, n_frames, track)
    return np.concatenate([features, np.stack([drive.jaw_open, drive.lip_open, drive.width, drive.round], 1)],
                          axis=1).astype(np.float32)


def condition_windows(phones: Sequence[Any] | None, wave: np.ndarray, sample_rate: int, fps: float,
                      n_frames: int, config: GeneratorConfig) -> np.ndarray | None:
    """[n_frames, config.viseme_width()] viseme windows for `config`, or None for an audio-only avatar."""
    if not config.viseme_frames:
        return None
    return feature_windows(frame_conditioning(phones, wave, sample_rate, fps, n_frames, config.mouth_drive),
                           config.viseme_frames)
