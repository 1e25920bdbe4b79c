"""Audio features for the talking-head generators: log-mel spectrogram windows, one per video frame.

numpy only (no librosa): the same code runs in ComfyUI, in CI and on GPU machines that lack
librosa/soundfile, and the features a model was trained on are bit-for-bit the features it is
driven with. Resampling uses scipy's polyphase filter when scipy is there (it always is with the
pack's OpenCV/ONNX stack), else linear interpolation.

Normalisation: each mel bin's mean over the clip is removed (a channel/microphone equaliser, so a
TTS voice drives a model trained on camera audio) and the clip is scaled by its global std; the
"silence" value used for padding is what a zero signal maps to after the same normalisation.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np


@dataclass(frozen=True)
class MelConfig:
    """Everything that defines the features; stored with each avatar so inference matches training."""

    sample_rate: int = 16000
    n_fft: int = 512
    win_length: int = 400   # 25 ms
    hop_length: int = 160   # 10 ms: 100 mel columns per second
    n_mels: int = 80
    fmin: float = 55.0
    fmax: float = 7600.0
    context_s: float = 0.2  # each side of the video frame's time

    @property
    def window_columns(self) -> int:
        """Mel columns per frame window (2 x context)."""
        return 2 * int(round(self.context_s * self.sample_rate / self.hop_length))

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "MelConfig":
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        return cls(**known)


LOG_FLOOR = 1e-5


def _hz_to_mel(f: np.ndarray) -> np.ndarray:  # HTK formula; any monotone scale works if used consistently
    return 2595.0 * np.log10(1.0 + np.asarray(f, np.float64) / 700.0)


def _mel_to_hz(m: np.ndarray) -> np.ndarray:
    return 700.0 * (10.0 ** (np.asarray(m, np.float64) / 2595.0) - 1.0)


def mel_filterbank(cfg: MelConfig) -> np.ndarray:
    """[n_mels, n_fft // 2 + 1] triangular filters, area-normalised."""
    n_bins = cfg.n_fft // 2 + 1
    freqs = np.linspace(0.0, cfg.sample_rate / 2.0, n_bins)
    edges = _mel_to_hz(np.linspace(_hz_to_mel(cfg.fmin), _hz_to_mel(cfg.fmax), cfg.n_mels + 2))
    lower, centre, upper = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    up = (freqs[None] - lower) / (centre - lower)
    down = (upper - freqs[None]) / (upper - centre)
    fb = np.maximum(0.0, np.minimum(up, down))
    fb *= (2.0 / (upper - lower))
    return fb.astype(np.float32)


def to_mono(wave: np.ndarray, name: str = "audio") -> np.ndarray:
    """[T], [C, T] or [B, C, T] (ComfyUI AUDIO waveform) -> float32 mono [T]."""
    w = np.asarray(wave, dtype=np.float32)
    if w.ndim == 3:
        w = w[0]
    if w.ndim == 2:
        w = w.mean(axis=0)
    if w.ndim != 1:
        raise ValueError(f"{name} must be a waveform [T], [C, T] or [B, C, T], got shape {np.shape(wave)}")
    if not np.all(np.isfinite(w)):
        raise ValueError(f"{name} contains NaN or infinite samples; decode it again")
    return w


def resample(wave: np.ndarray, sr_in: int, sr_out: int) -> np.ndarray:
    if int(sr_in) <= 0:
        raise ValueError(f"sample_rate must be a positive number of Hz, got {sr_in}")
    if sr_in == sr_out:
        return wave.astype(np.float32, copy=False)
    try:
        from scipy.signal import resample_poly
    except ImportError:  # pragma: no cover - scipy ships with the pack's dependencies
        n_out = int(round(len(wave) * sr_out / sr_in))
        t_out = np.arange(n_out) * (sr_in / sr_out)
        return np.interp(t_out, np.arange(len(wave)), wave).astype(np.float32)
    g = math.gcd(int(sr_in), int(sr_out))
    return resample_poly(wave, sr_out // g, sr_in // g).astype(np.float32)


def _raw_log_mel(wave16k: np.ndarray, cfg: MelConfig) -> np.ndarray:
    """log10 mel power [n_mels, frames], column j centred on sample j * hop (centre padding)."""
    pad = cfg.n_fft // 2
    x = np.pad(wave16k.astype(np.float32), (pad, pad))
    n_cols = 1 + max(0, (len(x) - cfg.n_fft)) // cfg.hop_length
    window = np.zeros(cfg.n_fft, np.float32)
    off = (cfg.n_fft - cfg.win_length) // 2
    window[off:off + cfg.win_length] = np.hanning(cfg.win_length + 1)[:-1]
    idx = np.arange(cfg.n_fft)[None, :] + cfg.hop_length * np.arange(n_cols)[:, None]
    frames = x[idx] * window
    power = np.abs(np.fft.rfft(frames, axis=1)) ** 2
    mel = mel_filterbank(cfg) @ power.T.astype(np.float32)
    return np.log10(np.maximum(mel, LOG_FLOOR)).astype(np.float32)


def log_mel(wave: np.ndarray, sample_rate: int, cfg: MelConfig = MelConfig()) -> tuple[np.ndarray, float]:
    """Normalised log-mel [n_mels, frames] at cfg.sample_rate, and the normalised silence value."""
    mono = resample(to_mono(wave), int(sample_rate), cfg.sample_rate)
    raw = _raw_log_mel(mono, cfg)
    mean = raw.mean(axis=1, keepdims=True)
    std = float(raw.std()) or 1.0
    silence = float((math.log10(LOG_FLOOR) - mean.mean()) / std)
    return (raw - mean) / std, silence


def windows_for_frames(wave: np.ndarray, sample_rate: int, fps: float, n_frames: int,
                       cfg: MelConfig = MelConfig()) -> np.ndarray:
    """[n_frames, 1, n_mels, T] log-mel windows centred on each video frame's time (frame i at
    i / fps; T = cfg.window_columns, +-cfg.context_s). Frames past the end of the audio see silence."""
    if not fps or fps <= 0:
        raise ValueError(f"fps must be a positive frame rate, got {fps}")
    if n_frames <= 0:
        raise ValueError(f"n_frames must be >= 1, got {n_frames}")
    mel, silence = log_mel(wave, sample_rate, cfg)
    half = cfg.window_columns // 2
    cols_per_s = cfg.sample_rate / cfg.hop_length
    centres = np.rint(np.arange(n_frames) * cols_per_s / float(fps)).astype(np.int64)
    padded = np.full((cfg.n_mels, mel.shape[1] + 2 * half + int(centres[-1]) + 1), silence, np.float32)
    padded[:, half:half + mel.shape[1]] = mel
    idx = centres[:, None] + np.arange(-half, half)[None, :] + half  # [n_frames, T] into padded
    windows = padded[:, idx]  # [n_mels, n_frames, T]
    return np.ascontiguousarray(windows.transpose(1, 0, 2)[:, None])
