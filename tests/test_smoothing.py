"""TemporalSmooth core: jitter removal without lag, flicker removal without motion blur, scene cuts."""
from __future__ import annotations

import numpy as np
import pytest

from digital_human.media.smoothing import (
    OneEuroFilter,
    _alpha,
    detect_scene_cuts,
    ema_filter,
    jitter,
    lag_frames,
    smooth_frames,
    smooth_landmarks,
)

FPS = 25.0


def _trajectory(clean: np.ndarray, sigma: float = 1.0, k: int = 5, seed: int = 0):
    """[N] clean signal -> ([N,K,2] clean, [N,K,2] noisy) landmark tracks sharing the motion."""
    c = np.repeat(np.repeat(clean[:, None, None], k, axis=1), 2, axis=2)
    return c, c + np.random.default_rng(seed).normal(0.0, sigma, c.shape)


T = np.arange(250) / FPS


@pytest.mark.parametrize("causal", [False, True])
def test_landmark_jitter_halves_without_lag_on_sine(causal):
    clean, noisy = _trajectory(5.0 * np.sin(2 * np.pi * 0.5 * T))
    out = smooth_landmarks(noisy, "one_euro", 0.5, FPS, causal=causal)
    assert out.shape == noisy.shape
    assert jitter(out) <= 0.5 * jitter(noisy)
    assert abs(lag_frames(clean, out, max_lag=5)) <= 1.0
    assert np.abs(out - clean).mean() < np.abs(noisy - clean).mean()


def test_landmark_step_is_followed_within_a_frame():
    step_at = 125
    clean, noisy = _trajectory(np.where(np.arange(250) >= step_at, 10.0, 0.0))
    out = smooth_landmarks(noisy, "one_euro", 0.7, FPS)
    assert jitter(out) <= 0.5 * jitter(noisy)
    track = out.mean(axis=(1, 2))
    crossing = int(np.argmax(track > 5.0))
    assert abs(crossing - step_at) <= 1
    assert abs(lag_frames(clean, out, max_lag=5)) <= 1.0


def test_mouth_speed_motion_keeps_amplitude_and_timing():
    clean, noisy = _trajectory(4.0 * np.sin(2 * np.pi * 3.0 * T), sigma=0.5)  # 3 Hz syllable rate
    out = smooth_landmarks(noisy, "one_euro", 0.5, FPS)
    assert abs(lag_frames(clean, out, max_lag=5)) <= 0.5
    assert out.std() >= 0.85 * clean.std()


def test_causal_ema_lags_and_zero_phase_does_not():
    clean, noisy = _trajectory(5.0 * np.sin(2 * np.pi * 0.5 * T))
    assert lag_frames(clean, smooth_landmarks(noisy, "ema", 0.5, FPS, causal=True)) >= 0.5
    assert abs(lag_frames(clean, smooth_landmarks(noisy, "ema", 0.5, FPS))) <= 0.2


def test_reset_at_keeps_shots_independent():
    clean, noisy = _trajectory(np.where(np.arange(100) >= 50, 100.0, 0.0), sigma=0.5)
    out = smooth_landmarks(noisy, "one_euro", 1.0, FPS, reset_at=[50])
    sigma = 0.5
    both = smooth_landmarks(noisy, "one_euro", 1.0, FPS, reset_at=[50], noise_level=sigma)
    np.testing.assert_allclose(both[50:], smooth_landmarks(noisy[50:], "one_euro", 1.0, FPS, noise_level=sigma))
    np.testing.assert_allclose(both[:50], smooth_landmarks(noisy[:50], "one_euro", 1.0, FPS, noise_level=sigma))
    assert abs(out[49].mean()) < 1.0 and abs(out[50].mean() - 100.0) < 1.0


def test_one_euro_without_beta_is_an_ema_and_vectorised():
    x = np.random.default_rng(1).normal(size=(40, 3, 2))
    f = OneEuroFilter(FPS, min_cutoff=2.0, beta=0.0)
    got = np.stack([f(v) for v in x])
    np.testing.assert_allclose(got, ema_filter(x, float(_alpha(2.0, 1 / FPS))), rtol=1e-12)
    f.reset()
    const = np.stack([f(np.full((3, 2), 7.0)) for _ in range(10)])
    assert np.all(const == 7.0)
    with pytest.raises(ValueError, match="reset"):
        f(np.zeros(4))


def test_strength_zero_and_none_are_identity():
    _, noisy = _trajectory(np.zeros(30))
    np.testing.assert_array_equal(smooth_landmarks(noisy, "one_euro", 0.0, FPS), noisy)
    np.testing.assert_array_equal(smooth_landmarks(noisy, "none", 0.9, FPS), noisy)


# ---------------------------------------------------------------------------------------------- frames


def _clip(n=60, h=64, w=64, sigma=0.02, seed=0):
    """Grey background, a moving red square and a 3 Hz 'mouth' bar, plus per-frame flicker noise."""
    clean = np.full((n, h, w, 3), 0.5, np.float32)
    yy, xx = np.mgrid[0:h, 0:w]
    for t in range(n):
        clean[t, (abs(yy - 20) < 8) & (abs(xx - 10 - 0.75 * t) < 8)] = [0.9, 0.3, 0.3]
        clean[t, (abs(yy - 50) < 4) & (abs(xx - 32) < 10)] = 0.5 + 0.1 * np.sin(2 * np.pi * 3 * t / FPS)
    noise = np.random.default_rng(seed).normal(0, sigma, clean.shape).astype(np.float32)
    return clean, np.clip(clean + noise, 0.0, 1.0)


def test_flicker_removed_without_blurring_motion():
    clean, noisy = _clip()
    out = smooth_frames(noisy, None, "one_euro", 0.7, FPS)
    moving = np.zeros(clean.shape[:3], bool)
    moving[1:] = np.abs(np.diff(clean, axis=0)).sum(-1) > 0
    still = ~moving
    assert np.abs(out - clean)[still].mean() <= 0.5 * np.abs(noisy - clean)[still].mean()
    assert np.abs(out - clean)[moving].mean() <= 1.1 * np.abs(noisy - clean)[moving].mean()
    bar = (slice(None), slice(47, 53), slice(24, 40))
    assert abs(lag_frames(clean[bar].mean((1, 2, 3)), out[bar].mean((1, 2, 3)), 5)) <= 1.0
    assert out[bar].mean((1, 2, 3)).std() >= 0.85 * clean[bar].mean((1, 2, 3)).std()
    # a fixed-alpha EMA does blur the moving square: the adaptive filter must beat it clearly
    ema = smooth_frames(noisy, None, "ema", 0.7, FPS)
    assert np.abs(ema - clean)[moving].mean() > 3 * np.abs(out - clean)[moving].mean()


def test_static_scene_frames_stay_unchanged():
    frame = np.random.default_rng(3).random((32, 48, 3)).astype(np.float32)
    frames = np.repeat(frame[None], 20, axis=0)
    np.testing.assert_array_equal(smooth_frames(frames, None, "one_euro", 1.0, FPS), frames)
    mask = np.zeros((32, 48), np.float32)
    mask[8:24, 10:30] = 1.0
    np.testing.assert_array_equal(smooth_frames(frames, mask, "one_euro", 1.0, FPS), frames)


def test_mask_limits_the_filter():
    _, noisy = _clip(n=20)
    mask = np.zeros(noisy.shape[:3], np.float32)
    mask[:, 40:60, 20:44] = 1.0
    out = smooth_frames(noisy, mask, "one_euro", 1.0, FPS)
    outside = mask == 0
    np.testing.assert_array_equal(out[outside], noisy[outside])
    assert np.abs(out - noisy)[mask > 0].mean() > 0.005
    assert out is not noisy and not np.shares_memory(out, noisy)


def test_scene_cut_resets_the_filter():
    _, shot_a = _clip(n=30, seed=1)
    ramp = np.linspace(0.0, 1.0, 64, dtype=np.float32)[None, None, :, None]
    shot_b = np.clip(_clip(n=30, seed=2)[1] + ramp - 0.5, 0.0, 1.0)  # a different picture
    frames = np.concatenate([shot_a, shot_b])
    assert detect_scene_cuts(frames, 0.08) == [30]
    out = smooth_frames(frames, None, "one_euro", 1.0, FPS, scene_cut_threshold=0.08, noise_level=0.02)
    alone_b = smooth_frames(shot_b, None, "one_euro", 1.0, FPS, noise_level=0.02)
    alone_a = smooth_frames(shot_a, None, "one_euro", 1.0, FPS, noise_level=0.02)
    np.testing.assert_allclose(out[30:], alone_b, atol=1e-6)
    np.testing.assert_allclose(out[:30], alone_a, atol=1e-6)
    # without the reset, the first frames of shot B carry shot A
    merged = smooth_frames(frames, None, "one_euro", 1.0, FPS, scene_cut_threshold=0.0, noise_level=0.02)
    assert np.abs(merged[29:31] - out[29:31]).max() > 0.01


def test_frames_progress_and_in_place():
    _, noisy = _clip(n=10)
    work = noisy.copy()
    calls = []
    res = smooth_frames(work, None, "one_euro", 0.5, FPS, out=work, progress=lambda d, t: calls.append((d, t)))
    assert res is work and calls[-1] == (20, 20)
    np.testing.assert_allclose(res, smooth_frames(noisy, None, "one_euro", 0.5, FPS), atol=1e-6)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(method="gauss"), "method"),
        (dict(strength=1.5), "strength"),
        (dict(fps=0.0), "fps"),
        (dict(mask=np.ones((5, 5), np.float32)), "mask"),
        (dict(frames=np.zeros((3, 8, 8, 3), np.uint8)), "float"),
        (dict(frames=np.zeros((3, 8, 8), np.float32)), r"\[N, H, W, 3\]"),
    ],
)
def test_frame_input_validation(kwargs, match):
    args = dict(frames=np.zeros((3, 8, 8, 3), np.float32), mask=None, method="one_euro", strength=0.5, fps=FPS)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        smooth_frames(**args)


def test_landmark_input_validation():
    with pytest.raises(ValueError, match="NaN"):
        smooth_landmarks(np.full((5, 2, 2), np.nan), "one_euro", 0.5, FPS)
    with pytest.raises(ValueError, match="strength"):
        smooth_landmarks(np.zeros((5, 2, 2)), "one_euro", -0.1, FPS)


# ---------------------------------------------------------------------------------------------- metrics


def test_metrics():
    x = np.random.default_rng(4).normal(size=(200, 3)).cumsum(axis=0)
    a = x[5:-5]
    assert lag_frames(a, x[2:-8], 6) == pytest.approx(3.0, abs=0.1)  # b[t] = a[t-3]: b lags by 3
    assert lag_frames(a, x[8:-2], 6) == pytest.approx(-3.0, abs=0.1)  # b leads by 3
    assert lag_frames(a, a, 6) == pytest.approx(0.0, abs=1e-9)
    line = np.linspace(0, 10, 50)
    assert jitter(line) == pytest.approx(0.0, abs=1e-12)
    assert jitter(np.array([0.0, 1.0, 0.0, 1.0])) == pytest.approx(2.0)


def test_bands_on_threads_give_the_same_result(monkeypatch):
    """Pixels are filtered independently, so splitting the box into row bands on threads must not
    change a single value (or the progress reports' end)."""
    rng = np.random.default_rng(3)
    frames = np.clip(0.5 + 0.05 * rng.standard_normal((20, 96, 40, 3)), 0, 1).astype(np.float32)
    mask = np.zeros((96, 40), np.float32)
    mask[10:90, 5:35] = 1.0
    results, ends = [], []
    for threads in ("1", "3"):
        monkeypatch.setenv("DIGITAL_HUMAN_FRAME_THREADS", threads)
        calls = []
        results.append(smooth_frames(frames, mask, strength=0.7, fps=25.0,
                                     progress=lambda d, t: calls.append((d, t))))
        ends.append(calls[-1])
    np.testing.assert_array_equal(results[0], results[1])
    assert ends[0] == ends[1] == (40, 40)


@pytest.mark.parametrize("method", ["one_euro", "ema"])
@pytest.mark.parametrize("per_frame_mask", [False, True])
def test_torch_filter_matches_numpy(method, per_frame_mask):
    """The torch path (what runs on a GPU) does the numpy filter's arithmetic: same output within
    float32 rounding, scene cuts and masks included; pixels outside the mask untouched."""
    rng = np.random.default_rng(5)
    frames = np.clip(0.5 + 0.04 * rng.standard_normal((24, 40, 30, 3)), 0, 1).astype(np.float32)
    frames[12:] += 0.3  # a scene cut at frame 12
    mask = np.zeros((24, 40, 30) if per_frame_mask else (40, 30), np.float32)
    mask[..., 5:35, 4:26] = 1.0
    mask[..., 5:8, 4:26] = 0.5  # soft edge
    ref = smooth_frames(frames, mask, method=method, strength=0.8, fps=25.0)
    calls = []
    got = smooth_frames(frames, mask, method=method, strength=0.8, fps=25.0, device="cpu",
                        progress=lambda d, t: calls.append((d, t)))
    np.testing.assert_allclose(got, ref, atol=2e-6, rtol=0)
    assert np.abs(got - frames).max() > 1e-3  # it did filter
    outside = (mask if mask.ndim == 3 else np.broadcast_to(mask, frames.shape[:3])) == 0
    np.testing.assert_array_equal(got[outside], frames[outside])
    assert calls[-1] == (48, 48)


@pytest.mark.parametrize("per_frame_mask", [False, True])
def test_tensor_smoothing_matches_smooth_frames(per_frame_mask):
    """smooth_frames_tensor (the headless video path, frames kept on the device) measures cuts and
    noise like smooth_frames and filters in place: same output within float32 rounding."""
    import torch

    from digital_human.media.smoothing import smooth_frames_tensor

    rng = np.random.default_rng(6)
    frames = np.clip(0.5 + 0.04 * rng.standard_normal((24, 44, 36, 3)), 0, 1).astype(np.float32)
    frames[12:] += 0.3  # a scene cut at frame 12
    frames = np.clip(frames, 0, 1)
    mask = np.zeros((24, 44, 36) if per_frame_mask else (44, 36), np.float32)
    mask[..., 6:38, 5:30] = 1.0
    mask[..., 6:9, 5:30] = 0.5
    ref = smooth_frames(frames, mask, strength=0.8, fps=25.0)
    x = torch.from_numpy(frames.copy())
    got = smooth_frames_tensor(x, torch.from_numpy(mask), strength=0.8, fps=25.0)
    assert got is x  # in place
    np.testing.assert_allclose(got.numpy(), ref, atol=2e-6, rtol=0)
    assert np.abs(ref - frames).max() > 1e-3
    with pytest.raises(ValueError, match="mask must be"):
        smooth_frames_tensor(torch.zeros(3, 8, 8, 3), torch.zeros(8, 9))
