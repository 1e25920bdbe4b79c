"""Small signal filters in numpy: a Butterworth band-pass, FFT convolution and 1-D running mean/minimum.

Why not scipy.signal / scipy.ndimage: importing scipy.signal costs 0.8-1.3 s on a 2-core CPU (it pulls
scipy.stats in), paid by every CLI command before any work, and the pack needs only these few
operations. They match the scipy functions they replace to float rounding (tests/test_audio_filters.py
compares them): the band-pass equals `sosfilt(butter(order, [lo, hi], "bandpass", fs=sr, output="sos"), x)`
(causal, zero initial state), the running filters equal `uniform_filter1d` / `minimum_filter1d` with
mode="nearest".
"""
from __future__ import annotations

import numpy as np

_TAIL = 1e-10  # the band-pass's impulse response is cut where every pole has decayed below this


def _butter_bandpass_zpk(order: int, low_hz: float, high_hz: float, sample_rate: float
                         ) -> tuple[np.ndarray, np.ndarray, float]:
    """Digital zeros, poles and gain of a Butterworth band-pass (analog prototype, low-pass to
    band-pass transform, bilinear transform with pre-warped band edges)."""
    if not 0 < low_hz < high_hz < sample_rate / 2:
        raise ValueError(f"band {low_hz}-{high_hz} Hz must lie inside (0, {sample_rate / 2}) Hz")
    fs2 = 2.0 * sample_rate
    w1, w2 = (fs2 * np.tan(np.pi * f / sample_rate) for f in (low_hz, high_hz))
    bw, w0 = w2 - w1, np.sqrt(w1 * w2)
    k = np.arange(-order + 1, order, 2)
    proto = -np.exp(1j * np.pi * k / (2 * order))              # unit-cutoff low-pass poles, left half-plane
    half = proto * bw / 2
    root = np.sqrt(half * half - w0 * w0)
    poles_s = np.concatenate([half + root, half - root])         # 2*order band-pass poles
    gain_s = bw ** order                                         # order zeros at s = 0
    poles = (fs2 + poles_s) / (fs2 - poles_s)
    zeros = np.concatenate([np.ones(order), -np.ones(order)])    # s = 0 -> z = 1, s = inf -> z = -1
    gain = float(np.real(gain_s * fs2 ** order / np.prod(fs2 - poles_s)))
    return zeros, poles, gain


def butter_bandpass_impulse(order: int, low_hz: float, high_hz: float, sample_rate: float,
                            max_length: int | None = None) -> np.ndarray:
    """Impulse response (float64) of the Butterworth band-pass, cut once it has decayed to ~1e-10.

    H(z) = g * prod(z - z_i) / prod(z - p_i) has as many zeros as poles, so by partial fractions of
    H(z)/z: h[n] = H(0) delta[n] + sum_i r_i p_i^n with r_i = g prod(p_i - z_j) / (p_i prod_{j != i}(p_i - p_j)).
    """
    zeros, poles, gain = _butter_bandpass_zpk(order, low_hz, high_hz, sample_rate)
    radius = float(np.max(np.abs(poles)))
    length = int(np.ceil(np.log(_TAIL) / np.log(radius))) + 1
    if max_length is not None:
        length = max(1, min(length, int(max_length)))
    diff = poles[:, None] - poles[None, :]
    np.fill_diagonal(diff, 1.0)
    residues = gain * np.prod(poles[:, None] - zeros[None, :], axis=1) / (poles * np.prod(diff, axis=1))
    n = np.arange(length)
    h = np.real(np.exp(n[:, None] * np.log(poles)[None, :]) @ residues)
    h[0] += gain * np.real(np.prod(-zeros) / np.prod(-poles))
    return h


def fft_convolve(x: np.ndarray, h: np.ndarray) -> np.ndarray:
    """Full linear convolution of two 1-D arrays (len(x) + len(h) - 1 samples), float64, via the FFT."""
    x, h = np.asarray(x, np.float64).reshape(-1), np.asarray(h, np.float64).reshape(-1)
    if x.size == 0 or h.size == 0:
        return np.zeros(0)
    n = x.size + h.size - 1
    size = 1 << int(np.ceil(np.log2(max(n, 1))))
    return np.fft.irfft(np.fft.rfft(x, size) * np.fft.rfft(h, size), size)[:n]


def bandpass(x: np.ndarray, sample_rate: float, low_hz: float, high_hz: float, order: int = 4) -> np.ndarray:
    """x through a causal Butterworth band-pass (zero initial state), same length, float64."""
    x = np.asarray(x, np.float64).reshape(-1)
    if x.size == 0:
        return x.copy()
    h = butter_bandpass_impulse(order, low_hz, high_hz, sample_rate, max_length=x.size)
    return fft_convolve(x, h)[: x.size]


def _pad_nearest(x: np.ndarray, size: int) -> np.ndarray:
    """x with its edge values repeated so that window i of `size` samples is centred on x[i] as
    scipy.ndimage centres it (size // 2 before, the rest after)."""
    if size < 1:
        raise ValueError(f"window size must be >= 1, got {size}")
    left = size // 2
    return np.concatenate([np.repeat(x[:1], left), x, np.repeat(x[-1:], size - 1 - left)])


def running_mean(x: np.ndarray, size: int) -> np.ndarray:
    """Mean over a window of `size` samples around each sample (edges repeated), float64."""
    x = np.asarray(x, np.float64).reshape(-1)
    if x.size == 0:
        return x.copy()
    c = np.concatenate([[0.0], np.cumsum(_pad_nearest(x, size))])
    return (c[size:] - c[:-size]) / size


def running_min(x: np.ndarray, size: int) -> np.ndarray:
    """Minimum over a window of `size` samples around each sample (edges repeated)."""
    x = np.asarray(x).reshape(-1)
    if x.size == 0:
        return x.copy()
    return np.lib.stride_tricks.sliding_window_view(_pad_nearest(x, size), size).min(axis=1)
