"""Median pitch (F0) of speech: one estimator for the reference speaker and for synthesized voices,
so "the clone keeps the speaker's pitch" compares like with like.

Two estimators:
- `voiced_f0` / `median_f0`: pYIN (librosa) at 8 kHz with a quarter-semitone grid. pYIN's cost is its
  Viterbi pass over pitch bins x frames, and the default 0.1-semitone grid made it the slowest step of
  a voice fit (17.7 s for 8 s of speech on the busy 2-core CPU); 0.25 semitone and a 20 ms hop took
  1.6 s and moved the median by 0.9 %. It ranks the bundled voices by pitch (its values are cached on
  disk by that name, clone.PROBE_PITCH_VERSION).
- `listener_f0` / `listener_median_f0` (issue 36): the pitch a listener hears, the median F0 over the
  frames that are clearly voiced. pYIN's voicing decision drops frames whose pitch moves (a 5 %
  vibrato at 85-100 Hz left NO voiced frame on a synthetic pulse train, tests/test_voice_pitch.py),
  and in speech that is the low, creaky or gliding part of a deep voice: the median then reads only
  the steadier frames. This one is YIN (de Cheveigne & Kawahara 2002: cumulative-mean-normalised
  difference, first dip under an absolute threshold, parabolic refinement) on 30 ms windows every
  10 ms, a frame counting as voiced when its periodicity is clear (normalised difference < 0.35) and it
  is within 35 dB of the clip's loud frames; isolated voiced frames (under 30 ms in a row) are
  dropped and each run is median-filtered over 5 frames, so single octave slips do not count. It is
  plain numpy (no Viterbi): 0.1-0.9 s for 20 s of speech against pYIN's 0.3-2.1 s in one run on the shared
  2-core CPU (benchmarks/voice_pitch_estimators.py).
"""
from __future__ import annotations

import numpy as np

PITCH_SR = 8000
FMIN, FMAX = 60.0, 500.0
HOP = 160  # 20 ms at 8 kHz
RESOLUTION = 0.25  # semitones per pYIN pitch bin

# listener_f0 (YIN) settings
YIN_WINDOW = 240  # 30 ms at 8 kHz: 1.8 periods at FMIN
YIN_HOP = 80  # 10 ms
YIN_THRESHOLD = 0.15  # the first dip under this is the period (YIN's absolute threshold)
# a frame is voiced when its normalised difference at the period is below this: at 0.25 a deep voice whose pitch
# glides (a synthetic 85 Hz pulse train with a 5 % vibrato, tests/test_voice_pitch.py) kept 55 % of its frames and
# read 3.2 % high; at 0.35 it keeps 80 % and reads within 2 %
VOICED_MAX = 0.35
LOUD_RANGE_DB = 35.0  # ... and its level within this of the clip's loud frames (95th percentile)
SILENT_DB = -80.0  # ... and above this (dB re full scale): digital silence is perfectly "periodic"
MIN_RUN = 3  # voiced frames in a row (30 ms) for a run to count
SMOOTH = 5  # median filter length inside a run (frames)


def _resample_8k(wave: np.ndarray, sample_rate: int) -> np.ndarray:
    wave = np.asarray(wave, np.float32).reshape(-1)
    if sample_rate == PITCH_SR:
        return wave
    import soxr  # librosa.resample's default backend, without librosa's import time

    return np.asarray(soxr.resample(wave, sample_rate, PITCH_SR, quality="HQ"), np.float32)


def voiced_f0(wave: np.ndarray, sample_rate: int) -> np.ndarray:
    """F0 (Hz) of the voiced frames of `wave` by pYIN (empty when nothing is voiced or the clip is too short)."""
    import librosa

    wave = np.asarray(wave, np.float32).reshape(-1)
    low = wave if sample_rate == PITCH_SR else librosa.resample(wave, orig_sr=sample_rate, target_sr=PITCH_SR)
    if len(low) < 1024:
        return np.zeros(0, np.float32)
    f0, voiced, _ = librosa.pyin(low, fmin=FMIN, fmax=FMAX, sr=PITCH_SR, frame_length=512, hop_length=HOP,
                                 resolution=RESOLUTION)
    return np.asarray(f0[voiced & np.isfinite(f0)], np.float32)


def median_f0(wave: np.ndarray, sample_rate: int) -> float:
    """Median pYIN F0 (Hz) over voiced frames; NaN when fewer than 10 frames are voiced."""
    f0 = voiced_f0(wave, sample_rate)
    return float(np.median(f0)) if f0.size >= 10 else float("nan")


def yin_track(wave: np.ndarray, sample_rate: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(F0 Hz, normalised difference at that period, level dB) per 10 ms frame, before any voicing decision."""
    x = _resample_8k(wave, sample_rate).astype(np.float64)
    tau_min, tau_max = int(PITCH_SR // FMAX), int(np.ceil(PITCH_SR / FMIN))
    span = YIN_WINDOW + tau_max + 1
    if x.size < span:
        return np.zeros(0), np.zeros(0), np.zeros(0)
    x = x - x.mean()
    n_frames = 1 + (x.size - span) // YIN_HOP
    idx = np.arange(span)[None, :] + YIN_HOP * np.arange(n_frames)[:, None]
    frames = x[idx]  # [F, span]
    head = frames[:, :YIN_WINDOW]
    n_fft = 1 << int(np.ceil(np.log2(span + YIN_WINDOW)))
    # r(tau) = sum_j head[j] * frame[j + tau], for tau in 0..tau_max
    spec = np.fft.rfft(frames, n_fft) * np.conj(np.fft.rfft(head, n_fft))
    r = np.fft.irfft(spec, n_fft)[:, :tau_max + 1]
    sq = np.concatenate([np.zeros((n_frames, 1)), np.cumsum(frames ** 2, axis=1)], axis=1)
    energy0 = sq[:, YIN_WINDOW][:, None]
    taus = np.arange(tau_max + 1)
    energy_tau = sq[:, taus + YIN_WINDOW] - sq[:, taus]  # sum of frame[j + tau]^2 over the window
    diff = np.maximum(energy0 + energy_tau - 2 * r, 0.0)
    cum = np.cumsum(diff[:, 1:], axis=1)
    cmnd = np.ones_like(diff)
    cmnd[:, 1:] = diff[:, 1:] * taus[1:] / np.maximum(cum, 1e-12)

    region = cmnd[:, tau_min:tau_max + 1]
    below = region < YIN_THRESHOLD
    has_dip = below.any(axis=1)
    first = np.where(has_dip, below.argmax(axis=1), region.argmin(axis=1))
    # walk from the first sub-threshold lag down to the bottom of its dip
    best = first.copy()
    rows = np.arange(n_frames)
    for _ in range(tau_max):
        nxt = np.minimum(best + 1, region.shape[1] - 1)
        step = has_dip & (region[rows, nxt] < region[rows, best]) & (nxt > best)
        if not step.any():
            break
        best = np.where(step, nxt, best)
    # parabolic refinement of the period
    lo, hi = np.clip(best - 1, 0, region.shape[1] - 1), np.clip(best + 1, 0, region.shape[1] - 1)
    a, b, c = region[rows, lo], region[rows, best], region[rows, hi]
    denom = a - 2 * b + c
    shift = np.where((lo < best) & (hi > best) & (np.abs(denom) > 1e-12), 0.5 * (a - c) / np.where(
        np.abs(denom) > 1e-12, denom, 1.0), 0.0)
    period = tau_min + best + np.clip(shift, -0.5, 0.5)
    level = 10 * np.log10(np.maximum(energy0[:, 0] / YIN_WINDOW, 1e-20))
    return (PITCH_SR / period).astype(np.float32), region[rows, best].astype(np.float32), level.astype(np.float32)


def listener_f0(wave: np.ndarray, sample_rate: int) -> np.ndarray:
    """F0 (Hz) of the clearly voiced frames of `wave` (YIN; see the module docstring). Empty when none."""
    f0, aperiodicity, level = yin_track(wave, sample_rate)
    if f0.size == 0:
        return np.zeros(0, np.float32)
    loud = np.percentile(level, 95)
    voiced = (aperiodicity < VOICED_MAX) & (level > max(loud - LOUD_RANGE_DB, SILENT_DB)) & (f0 >= FMIN) & (f0 <= FMAX)
    out = []
    edges = np.flatnonzero(np.diff(np.concatenate([[0], voiced.astype(np.int8), [0]])))
    for start, end in zip(edges[::2], edges[1::2]):
        if end - start < MIN_RUN:
            continue
        run = f0[start:end]
        half = SMOOTH // 2
        padded = np.pad(run, half, mode="edge")
        out.append(np.median(np.lib.stride_tricks.sliding_window_view(padded, SMOOTH), axis=1))
    return np.concatenate(out).astype(np.float32) if out else np.zeros(0, np.float32)


def listener_median_f0(wave: np.ndarray, sample_rate: int) -> float:
    """Median F0 (Hz) a listener hears: over the clearly voiced frames; NaN when fewer than 10 are voiced."""
    f0 = listener_f0(wave, sample_rate)
    return float(np.median(f0)) if f0.size >= 10 else float("nan")
