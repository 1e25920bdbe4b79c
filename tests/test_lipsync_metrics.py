"""Lip-sync metrics (vision/lipsync_metrics.py) on synthetic inputs with known answers."""
from __future__ import annotations

import numpy as np
import pytest

from digital_human.vision import lipsync_metrics as M


def _face(gap: float = 0.0, iod: float = 100.0, seed: int = 0) -> np.ndarray:
    """Random 468-point 'face' with outer eye corners iod apart and the inner lips `gap` apart."""
    rng = np.random.default_rng(seed)
    lm = rng.uniform(0, 200, (468, 3)).astype(np.float64)
    lm[33, :2], lm[263, :2] = (50, 80), (50 + iod, 80)
    for up, lo in M.GAP_PAIRS:
        x = rng.uniform(80, 120)
        lm[up, :2], lm[lo, :2] = (x, 150), (x, 150 + gap)
    return lm


def test_mouth_opening_is_gap_over_iod():
    lms = np.stack([_face(gap=g, iod=iod) for g, iod in ((0, 100), (12, 100), (12, 60))])
    np.testing.assert_allclose(M.mouth_opening(lms), [0.0, 0.12, 0.2], atol=1e-9)
    with pytest.raises(ValueError, match="468"):
        M.mouth_opening(np.zeros((2, 68, 2)))


@pytest.mark.parametrize("shift", [-3, 0, 2])
def test_av_lag_sign_and_value(shift):
    rng = np.random.default_rng(1)
    env = np.convolve(rng.standard_normal(400), np.ones(4) / 4, mode="same")
    # the mouth follows the sound `shift` frames later (positive = video late)
    opening = np.roll(env, shift)
    lag_ms, corr = M.av_lag(opening, env, fps=25.0)
    assert lag_ms == pytest.approx(shift * 40.0, abs=8.0)
    assert corr > 0.95


def test_av_lag_of_unrelated_series_is_weak():
    rng = np.random.default_rng(2)
    _, corr = M.av_lag(rng.standard_normal(300), rng.standard_normal(300), fps=30)
    assert corr < 0.3


def test_speech_envelope_is_centred_on_frame_times():
    sr, fps = 16000, 25.0
    wave = np.zeros(sr * 3, np.float32)
    rng = np.random.default_rng(3)
    wave[sr: sr + sr // 2] = 0.3 * rng.standard_normal(sr // 2)  # speech-band noise 1.0-1.5 s
    env = M.speech_envelope(wave, sr, fps, 75)
    loud = np.flatnonzero(env > env.max() - 6.0)
    # frames whose time i/fps is inside the burst (1.0 s = frame 25 .. 1.5 s = frame 37.5), +-1 frame of window spread
    assert 24 <= loud.min() <= 26 and 36 <= loud.max() <= 38
    assert env[5] <= env.max() - 40


def test_mouth_landmark_distance_ignores_pose_and_measures_lips():
    real = _face(gap=5.0)[None]
    angle, scale, shift = 0.2, 1.3, np.array([15.0, -7.0])
    rot = np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])
    pred = real.copy()
    pred[..., :2] = (real[..., :2] @ rot.T) * scale + shift
    assert M.mouth_landmark_distance(pred, real) == pytest.approx(0.0, abs=1e-9)
    moved = real.copy()
    moved[0, list(M.MOUTH_POINTS), 1] += 3.0  # every lip point 3 px down; iod 100 px
    assert M.mouth_landmark_distance(moved, real) == pytest.approx(0.03, rel=1e-6)
    assert M.mouth_landmark_distance(moved, real, per_frame=True).shape == (1,)


def test_psnr_outside_mask():
    rng = np.random.default_rng(4)
    a = rng.integers(0, 256, (2, 32, 32, 3), dtype=np.uint8)
    b = a.copy()
    mask = np.zeros((32, 32), np.float32)
    mask[8:20, 8:20] = 1.0
    b[:, 8:20, 8:20] = 0  # changes only inside the mask
    assert M.psnr_outside_mask(a, b, mask) == float("inf")
    b[:, 0, 0, 0] = a[:, 0, 0, 0] ^ 0xFF  # one outside pixel per frame differs
    d = np.abs(a[:, 0, 0, 0].astype(float) - b[:, 0, 0, 0].astype(float))
    outside = 2 * (32 * 32 - 144) * 3
    expected = 10 * np.log10(255.0 ** 2 / ((d ** 2).sum() / outside))
    assert M.psnr_outside_mask(a, b, mask) == pytest.approx(expected, rel=1e-9)
    with pytest.raises(ValueError, match="covers every pixel"):
        M.psnr_outside_mask(a, b, np.ones((32, 32)))


def test_mouth_ssim_scores_the_mouth_box_only():
    rng = np.random.default_rng(0)
    lms = np.stack([_face(seed=s) for s in range(3)])
    xy = lms[..., :2]
    lms[..., :2] = xy - xy.min(axis=(0, 1)) + 40  # inside a 400 px frame
    real = rng.integers(0, 256, (3, 400, 400, 3), dtype=np.uint8)
    real = np.repeat(np.repeat(real[:, ::8, ::8], 8, 1), 8, 2)[:, :400, :400]  # blocky: structure to compare
    assert M.mouth_ssim(real, real, lms) == pytest.approx(1.0)
    noisy = np.clip(real.astype(int) + rng.normal(0, 40, real.shape), 0, 255).astype(np.uint8)
    assert M.mouth_ssim(noisy, real, lms) < 0.8
    far = real.copy()  # changed only far from the mouth: no effect
    mouth = lms[0, list(M.MOUTH_POINTS), :2]
    far[:, :, int(mouth[:, 0].max() + 60):] = 0
    assert M.mouth_ssim(far, real, lms) == pytest.approx(1.0)
    per = M.mouth_ssim(noisy, real, lms, per_frame=True)
    assert per.shape == (3,) and np.all(per < 1)
    with pytest.raises(ValueError, match="frames must be"):
        M.mouth_ssim(real[:, :200], real, lms)
