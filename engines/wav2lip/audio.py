"""Wav2Lip's audio features: its mel spectrogram (the release's hparams) and a 16-frame window per video frame.

The reference (audio.py + hparams.py, librosa 0.7 as its requirements pin) computes at 16 kHz: pre-emphasis
0.97, STFT n_fft 800 / hop 200 / Hann window 800 centred with reflect padding (80 mel frames a second),
magnitude -> 80 Slaney mel bands 55..7600 Hz -> 20 log10(max(1e-5, x)) - 20 dB -> (x + 100) / 100 mapped to
-4..4 and clipped. Video frame i reads mel frames [int(i x 80 / fps), +16), the last window once that runs
past the end (inference.py's loop). Re-implemented with numpy (no librosa); stage-compared with the reference
in benchmarks/wav2lip_parity.py.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

SAMPLE_RATE = 16000
N_FFT = 800
HOP = 200
WIN = 800
N_MELS = 80
FMIN, FMAX = 55.0, 7600.0
PREEMPHASIS = 0.97
MIN_LEVEL_DB = -100.0
REF_LEVEL_DB = 20.0
MAX_ABS = 4.0
MEL_STEPS = 16
MEL_FPS = SAMPLE_RATE / HOP  # 80


def _hz_to_mel(f: np.ndarray) -> np.ndarray:
    """Slaney's mel scale: linear below 1 kHz, logarithmic above (librosa's htk=False)."""
    f = np.asarray(f, np.float64)
    f_sp = 200.0 / 3
    mels = f / f_sp
    min_log_hz, min_log_mel, logstep = 1000.0, 1000.0 / f_sp, np.log(6.4) / 27.0
    return np.where(f >= min_log_hz, min_log_mel + np.log(np.maximum(f, 1e-10) / min_log_hz) / logstep, mels)


def _mel_to_hz(m: np.ndarray) -> np.ndarray:
    m = np.asarray(m, np.float64)
    f_sp = 200.0 / 3
    freqs = f_sp * m
    min_log_hz, min_log_mel, logstep = 1000.0, 1000.0 / f_sp, np.log(6.4) / 27.0
    return np.where(m >= min_log_mel, min_log_hz * np.exp(logstep * (m - min_log_mel)), freqs)


@lru_cache(maxsize=2)
def mel_basis() -> np.ndarray:
    """float32 [80, 401] triangular Slaney-normalised filters (area-normalised, as librosa's norm='slaney')."""
    fft_freqs = np.linspace(0.0, SAMPLE_RATE / 2, 1 + N_FFT // 2)
    mel_f = _mel_to_hz(np.linspace(_hz_to_mel(FMIN), _hz_to_mel(FMAX), N_MELS + 2))
    fdiff = np.diff(mel_f)
    ramps = mel_f[:, None] - fft_freqs[None, :]
    lower = -ramps[:-2] / fdiff[:-1, None]
    upper = ramps[2:] / fdiff[1:, None]
    weights = np.maximum(0.0, np.minimum(lower, upper))
    weights *= (2.0 / (mel_f[2:N_MELS + 2] - mel_f[:N_MELS]))[:, None]
    return weights.astype(np.float32)


@lru_cache(maxsize=2)
def _window() -> np.ndarray:
    n = np.arange(WIN)
    return 0.5 - 0.5 * np.cos(2.0 * np.pi * n / WIN)  # periodic Hann (scipy get_window 'hann', fftbins)


def melspectrogram(wave16k: np.ndarray) -> np.ndarray:
    """float64 [80, 1 + len // 200] normalised mel spectrogram of 16 kHz mono audio, as the reference's."""
    x = np.asarray(wave16k, np.float64)
    if x.ndim != 1 or x.size < N_FFT // 2 + 1:
        raise ValueError(f"Wav2Lip needs at least {(N_FFT // 2 + 1) / SAMPLE_RATE:.3f} s of mono audio, "
                         f"got {x.shape}")
    y = np.empty_like(x)
    y[0] = x[0]
    y[1:] = x[1:] - PREEMPHASIS * x[:-1]
    y = np.pad(y, N_FFT // 2, mode="reflect")
    n_frames = 1 + (len(y) - N_FFT) // HOP
    frames = np.lib.stride_tricks.as_strided(y, (n_frames, N_FFT), (y.strides[0] * HOP, y.strides[0]))
    mag = np.abs(np.fft.rfft(frames * _window(), axis=1)).T  # [401, T]
    mel = np.dot(mel_basis(), mag)
    min_level = np.exp(MIN_LEVEL_DB / 20 * np.log(10))
    db = 20 * np.log10(np.maximum(min_level, mel)) - REF_LEVEL_DB
    return np.clip((2 * MAX_ABS) * ((db - MIN_LEVEL_DB) / (-MIN_LEVEL_DB)) - MAX_ABS, -MAX_ABS, MAX_ABS)


def window_starts(n_frames: int, fps: float, n_mel: int) -> np.ndarray:
    """int64 [n_frames]: the first mel frame of each video frame's 16-frame window (inference.py's
    int(i x 80 / fps), the last full window once a window would run past the end)."""
    if n_mel < MEL_STEPS:
        raise ValueError(f"the audio gives {n_mel} mel frames; Wav2Lip needs at least {MEL_STEPS} (0.2 s)")
    step = 80.0 / float(fps)
    starts = np.array([int(i * step) for i in range(n_frames)], np.int64)
    return np.minimum(starts, n_mel - MEL_STEPS)


def mel_windows(mel: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """float32 [k, 1, 80, 16] windows starting at `starts`."""
    idx = np.asarray(starts, np.int64)[:, None] + np.arange(MEL_STEPS)[None, :]
    return np.ascontiguousarray(mel[:, idx].transpose(1, 0, 2)[:, None], np.float32)


def to_16k(wave: np.ndarray, rate: int) -> np.ndarray:
    """Mono float32 audio at 16 kHz (soxr_hq, what librosa.load(sr=16000) uses in current librosa; the reference's
    librosa 0.7 resampled with resampy's kaiser_best, so non-16-kHz input differs from it by the resampler)."""
    wave = np.asarray(wave, np.float32)
    if int(rate) == SAMPLE_RATE:
        return wave
    import soxr

    return np.asarray(soxr.resample(wave, int(rate), SAMPLE_RATE, quality="soxr_hq"), np.float32)
