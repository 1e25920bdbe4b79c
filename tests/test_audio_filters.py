"""audio/filters.py against the scipy functions it replaces (scipy stays a test-time reference only)."""
from __future__ import annotations

import numpy as np
import pytest

from digital_human.audio.filters import bandpass, butter_bandpass_impulse, fft_convolve, running_mean, running_min

signal = pytest.importorskip("scipy.signal")
ndimage = pytest.importorskip("scipy.ndimage")


@pytest.mark.parametrize("sample_rate", [8000, 16000, 22050, 24000, 44100, 48000])
def test_bandpass_equals_scipy_sosfilt(sample_rate):
    x = np.random.default_rng(sample_rate).standard_normal(2 * sample_rate)
    high = min(3500.0, 0.45 * sample_rate)
    sos = signal.butter(4, [150.0, high], btype="bandpass", fs=sample_rate, output="sos")
    ref = signal.sosfilt(sos, x)
    ours = bandpass(x, sample_rate, 150.0, high, order=4)
    assert ours.shape == x.shape
    assert np.abs(ours - ref).max() <= 1e-9 * np.abs(ref).max()


@pytest.mark.parametrize("order", [1, 2, 3, 6])
def test_impulse_response_matches_other_orders(order):
    sr = 16000
    impulse = np.zeros(4000)
    impulse[0] = 1.0
    ref = signal.sosfilt(signal.butter(order, [300.0, 3000.0], btype="bandpass", fs=sr, output="sos"), impulse)
    ours = butter_bandpass_impulse(order, 300.0, 3000.0, sr)
    n = min(len(ours), len(ref))
    assert np.abs(ours[:n] - ref[:n]).max() < 1e-9
    assert np.abs(ref[n:]).max(initial=0.0) < 1e-8  # what was cut had decayed


def test_bandpass_short_and_empty_inputs():
    assert bandpass(np.zeros(0), 16000, 150.0, 3500.0).shape == (0,)
    x = np.random.default_rng(1).standard_normal(7)
    ref = signal.sosfilt(signal.butter(4, [150.0, 3500.0], btype="bandpass", fs=16000, output="sos"), x)
    assert np.allclose(bandpass(x, 16000, 150.0, 3500.0), ref, atol=1e-12)
    with pytest.raises(ValueError, match="band"):
        bandpass(x, 16000, 150.0, 9000.0)


@pytest.mark.parametrize("size", [1, 2, 3, 4, 5, 8, 101, 300])
def test_running_filters_equal_ndimage_nearest(size):
    x = np.random.default_rng(size).standard_normal(500)
    assert np.allclose(running_mean(x, size), ndimage.uniform_filter1d(x, size, mode="nearest"), atol=1e-12)
    assert np.array_equal(running_min(x, size), ndimage.minimum_filter1d(x, size, mode="nearest"))


def test_fft_convolve_equals_full_convolution():
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal(1234), rng.standard_normal(77)
    assert np.allclose(fft_convolve(a, b), np.convolve(a, b), atol=1e-10)
    assert fft_convolve(a, np.zeros(0)).shape == (0,)
