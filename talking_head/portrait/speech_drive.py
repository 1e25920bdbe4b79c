"""Per-output-frame mouth parameters from a speech waveform (the `portrait` model's "brain").

Four parameters in 0..1 per output frame:
  jaw_open  - how far the jaw drops (loudness of voiced speech),
  lip_open  - inner-lip gap (follows jaw_open, starts a little later, closes fully on stops/silence),
  width     - spreading (front vowels /i/, /e/: strong 1.5-3.5 kHz band vs 0.3-1.5 kHz),
  round     - rounding (back rounded vowels /u/, /o/: the opposite ratio).
Sibilants and fricatives (energy mostly above 4 kHz) keep the mouth narrow even when loud.

Features come from a 25 ms Hann STFT every 10 ms, levels are relative to the clip's own loudness
(95th percentile), so any recording level works. Smoothing is asymmetric (fast attack, slower
release, as real articulators open quickly and relax slowly), and its delay is cancelled by
reading the smoothed curve `lead_s` ahead: lips also move slightly before the sound they shape.

Frame clock: frame i shows time i / fps (see vision/lipsync_metrics.py); each frame's parameters
come from audio averaged over [t_i - 0.5/fps, t_i + 0.5/fps] (the frame's own interval).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

HOP_S = 0.010
WIN_S = 0.025
ATTACK_S = 0.020   # one-pole time constant while opening
RELEASE_S = 0.060  # ... while closing
LEAD_S = 0.020     # compensates the smoother's delay on openings (tuned so the measured lag is ~0)
SILENCE_DBFS = -48.0  # frames quieter than this are silence whatever the clip's own level
DYNAMIC_RANGE_DB = 32.0  # loudness span mapped onto 0..1 of opening, below the clip's loud level


@dataclass
class MouthParams:
    """Per-frame mouth controls, each float32 [N] in 0..1, at times = arange(N) / fps."""
    jaw_open: np.ndarray
    lip_open: np.ndarray
    width: np.ndarray
    round: np.ndarray
    fps: float

    def __len__(self) -> int:
        return len(self.jaw_open)

    def scaled(self, strength: float) -> "MouthParams":
        """Movement amplitudes times `strength` (0 = still mouth, 1 = default, >1 exaggerated)."""
        s = float(strength)
        return MouthParams(*(np.clip(a * s, 0.0, 1.5).astype(np.float32)
                             for a in (self.jaw_open, self.lip_open, self.width, self.round)), fps=self.fps)


def _stft_power(x: np.ndarray, sr: int) -> tuple[np.ndarray, np.ndarray, int, np.ndarray]:
    """Power spectra [J, F] of 25 ms Hann frames centred every 10 ms (frame j at j*hop samples),
    the bin frequencies, the hop and each frame's RMS level in dBFS."""
    hop = max(1, int(round(HOP_S * sr)))
    win = max(16, int(round(WIN_S * sr)))
    n_fft = 1 << (win - 1).bit_length()
    j = int(np.ceil(len(x) / hop)) + 1
    padded = np.pad(x, (win // 2, win + j * hop))
    idx = np.arange(j)[:, None] * hop + np.arange(win)[None, :]
    window = np.hanning(win)
    frames = padded[idx] * window[None, :]
    power = np.abs(np.fft.rfft(frames, n_fft, axis=1)) ** 2
    dbfs = 10 * np.log10((frames ** 2).sum(1) / (window ** 2).sum() + 1e-12)
    return power, np.fft.rfftfreq(n_fft, 1.0 / sr), hop, dbfs


def _band(power: np.ndarray, freqs: np.ndarray, lo: float, hi: float) -> np.ndarray:
    sel = (freqs >= lo) & (freqs < hi)
    return power[:, sel].sum(1) if sel.any() else np.zeros(len(power))


def attack_release(x: np.ndarray, dt: float, attack_s: float = ATTACK_S, release_s: float = RELEASE_S) -> np.ndarray:
    """One-pole smoother with different time constants for rising and falling input."""
    a_up = 1.0 - np.exp(-dt / max(attack_s, 1e-6))
    a_dn = 1.0 - np.exp(-dt / max(release_s, 1e-6))
    y = np.empty_like(x)
    acc = float(x[0]) if len(x) else 0.0
    for i, v in enumerate(x):  # J ~ 100/s of audio: a python loop is ~1 ms per 10 s
        acc += (a_up if v > acc else a_dn) * (v - acc)
        y[i] = acc
    return y


def speech_features(wave: np.ndarray, sr: int) -> dict[str, np.ndarray]:
    """10 ms features: loudness 0..1 (`level`), `sibilance` 0..1, `spread` (-1 round .. +1 spread)
    and a `voiced` weight; also `hop_s`."""
    x = np.asarray(wave, np.float64).reshape(-1)
    power, freqs, hop, dbfs = _stft_power(x, sr)
    eps = 1e-10
    total = _band(power, freqs, 80, min(8000, sr / 2)) + eps
    voiced = _band(power, freqs, 80, 3500) + eps
    high = _band(power, freqs, 4000, min(10000, sr / 2)) + eps
    low_f2 = _band(power, freqs, 300, 1500) + eps
    high_f2 = _band(power, freqs, 1500, 3500) + eps

    db = 10 * np.log10(total)
    loud_ref = float(np.percentile(db, 95))
    noise = float(np.percentile(db, 10))
    floor = max(noise + 6.0, loud_ref - DYNAMIC_RANGE_DB)
    level = np.clip((db - floor) / max(loud_ref - floor, 6.0), 0.0, 1.0)
    # absolute gate: levels are clip-relative, so room noise alone must not read as speech
    level = level * np.clip((dbfs - SILENCE_DBFS) / 8.0, 0.0, 1.0)

    hf_ratio = high / (voiced + high)
    sibilance = np.clip((hf_ratio - 0.35) / 0.4, 0.0, 1.0)  # 's', 'sh', 'f': energy above 4 kHz
    tilt = np.log(high_f2 / low_f2)
    speech = level > 0.25
    if speech.sum() >= 10:  # speaker-relative: centre on this voice's own typical balance
        med = float(np.median(tilt[speech]))
        spread_scale = float(np.percentile(np.abs(tilt[speech] - med), 80)) + 1e-3
    else:
        med, spread_scale = float(np.median(tilt)), 1.0
    spread = np.clip((tilt - med) / spread_scale, -1.0, 1.0) * (1.0 - sibilance)
    return {"level": level, "sibilance": sibilance, "spread": spread,
            "voiced": np.clip((level - 0.15) / 0.3, 0.0, 1.0), "hop_s": np.array(hop / sr)}


def _sample(curve: np.ndarray, hop_s: float, times: np.ndarray, fps: float) -> np.ndarray:
    """Mean of a 10 ms curve over each frame's interval [t - 0.5/fps, t + 0.5/fps]."""
    t_curve = np.arange(len(curve)) * hop_s
    c = np.concatenate([[0.0], np.cumsum((curve[1:] + curve[:-1]) * 0.5 * hop_s)])  # integral

    def integral(t: np.ndarray) -> np.ndarray:
        return np.interp(t, t_curve, c, left=0.0, right=c[-1])

    half = 0.5 / fps
    lo, hi = times - half, times + half
    return (integral(hi) - integral(lo)) / (hi - lo)


def mouth_params(wave: np.ndarray, sr: int, fps: float, n_frames: int, *, lead_s: float = LEAD_S,
                 attack_s: float = ATTACK_S, release_s: float = RELEASE_S) -> MouthParams:
    """MouthParams for `n_frames` output frames at `fps` from a mono waveform."""
    if fps <= 0 or n_frames <= 0:
        raise ValueError(f"mouth_params needs fps > 0 and n_frames > 0, got fps={fps}, n_frames={n_frames}")
    f = speech_features(wave, sr)
    hop_s = float(f["hop_s"])
    openness = f["level"] ** 0.8 * (1.0 - 0.65 * f["sibilance"])
    jaw = attack_release(openness, hop_s, attack_s, release_s)
    # lips part a touch after the jaw starts and close completely at stops: a threshold on the jaw curve
    lip = np.clip((attack_release(openness, hop_s, attack_s * 0.7, release_s * 0.7) - 0.06) / 0.94, 0, 1)
    spread = attack_release(f["spread"] * f["voiced"], hop_s, 0.04, 0.08)
    width = np.clip(spread, 0.0, 1.0)
    rnd = np.clip(-spread, 0.0, 1.0)
    times = np.arange(n_frames) / float(fps) + lead_s
    out = [np.clip(_sample(c, hop_s, times, fps), 0.0, 1.0).astype(np.float32) for c in (jaw, lip, width, rnd)]
    return MouthParams(*out, fps=float(fps))
