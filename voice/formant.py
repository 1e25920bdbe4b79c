"""Formant (vocal-tract length) scaling: play Kokoro's speech faster or slower, with pitch and tempo
restored by Kokoro's own controls.

Kokoro's bundled voices fix where the formants sit, and GE2E hears vocal-tract length: on the
benchmark, moving only the formants of a fitted voice by 4-12 % changed its GE2E similarity by up
to +-0.05. Resampling moves every frequency by the same factor (formants, harmonics) and the
duration by its inverse; asking Kokoro for pitch f0/alpha and speed speed/alpha beforehand cancels
the pitch and tempo change, so only the formants move. Unlike envelope warping in a vocoder (WORLD
re-synthesis hurt intelligibility, see DESIGN.md), the speech itself is untouched: it is the same
waveform, band-limited resampled (soxr).
"""
from __future__ import annotations

import numpy as np

# Beyond about +-15 % the speech starts to sound like a different age/sex rather than a different
# speaker, and the f0/speed asked of Kokoro drifts towards the edge of its controls.
FORMANT_RANGE = (0.86, 1.16)
# Ceiling for a base voice whose own pitch is a woman's (issue 18, English intelligibility): raising an adult
# woman's formants moves them towards a child's, which made the female English clone hard to understand;
# men's voices raised as far stayed intelligible, so they keep the full range. The cost: a woman whose formants
# sit higher than the ceiling gets less similarity. Measurements behind the value: RESULTS_voice.md, v7 and v8.
HIGH_VOICE_HZ = 165.0  # median probe pitch from which a bundled voice counts as a woman's (jf_*: 233-328 Hz)
HIGH_VOICE_FORMANT_MAX = 1.035  # v8: x1.07 still cost a native English voice (af_jessica) WER, x1.035 did not


def formant_range(voice_pitch_hz: float) -> tuple[float, float]:
    """The formant scales a search may use on a base voice whose own median pitch is `voice_pitch_hz`
    (NaN: unknown, the full range)."""
    if np.isfinite(voice_pitch_hz) and float(voice_pitch_hz) >= HIGH_VOICE_HZ:
        return FORMANT_RANGE[0], min(FORMANT_RANGE[1], HIGH_VOICE_FORMANT_MAX)
    return FORMANT_RANGE


def clip_formant(scale: float, limits: tuple[float, float] = FORMANT_RANGE) -> float:
    return float(np.clip(scale, *limits))


def synthesis_controls(f0_scale: float, speed: float, formant: float) -> tuple[float, float]:
    """(f0 scale, speed) to ask Kokoro for, so that after formant_shift(…, formant) the pitch is
    f0_scale and the tempo is speed."""
    return float(f0_scale) / float(formant), float(speed) / float(formant)


def formant_shift(wave: np.ndarray, sample_rate: int, formant: float) -> np.ndarray:
    """`wave` played `formant` times faster: all frequencies x formant, duration / formant."""
    wave = np.asarray(wave, np.float32).reshape(-1)
    if abs(float(formant) - 1.0) < 1e-4 or wave.size == 0:
        return wave
    if not 0.5 <= float(formant) <= 2.0:
        raise ValueError(f"formant scale must be within 0.5..2.0, got {formant}")
    import soxr  # what librosa.resample(res_type="soxr_hq") calls; importing librosa costs ~1 s of startup

    # reading the samples as if recorded at rate*formant, then resampling to the rate, speeds them up
    orig_rate, target_rate = float(sample_rate) * float(formant), float(sample_rate)
    out = soxr.resample(wave, orig_rate, target_rate, quality="soxr_hq")
    length = int(np.ceil(wave.size * target_rate / orig_rate))  # librosa's fix=True: exactly ceil(n * ratio)
    out = out[:length] if out.size >= length else np.pad(out, (0, length - out.size))
    return np.asarray(out, np.float32)
