"""The streaming pixel filter (media/stream_smooth.py, the headless video path) against the whole-clip
TemporalSmooth filter (media/smoothing.smooth_frames): same values, however the frames arrive."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from digital_human.media.smoothing import smooth_frames
from digital_human.media.stream_smooth import StreamingSmoother, smooth_stream


def _clip(n: int = 70, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    base = rng.uniform(0.2, 0.8, (1, 24, 30, 3)).astype(np.float32)
    drift = np.linspace(0, 0.2, n, dtype=np.float32)[:, None, None, None]  # a slow change to follow
    flicker = rng.normal(0, 0.01, (n, 24, 30, 3)).astype(np.float32)
    frames = np.clip(base + drift * (np.arange(30) / 30)[None, None, :, None] + flicker, 0, 1)
    mask = np.clip(rng.uniform(-0.5, 1.5, (24, 30)), 0, 1).astype(np.float32)  # soft, with 0 and 1 parts
    return frames.astype(np.float32), mask


@pytest.mark.parametrize("method", ["one_euro", "ema"])
@pytest.mark.parametrize("chunk", [1, 7, 70])
def test_streamed_equals_whole_clip(method: str, chunk: int):
    frames, mask = _clip()
    whole = smooth_frames(frames, mask, method=method, strength=0.5, fps=25.0, noise_level=0.01)
    smoother = StreamingSmoother(method, 0.5, 25.0, noise_level=0.01)
    chunks = [(torch.from_numpy(frames[i:i + chunk]), torch.from_numpy(mask)) for i in range(0, len(frames), chunk)]
    out = dict(smooth_stream(chunks, smoother))
    streamed = np.stack([out[t].numpy() for t in range(len(frames))])
    assert np.abs(streamed - whole).max() < 0.01 / 255  # the streamed backward pass starts from a lookahead
    outside = mask == 0
    assert np.array_equal(streamed[:, outside], frames[:, outside])  # outside the mask: the input, exactly
    assert np.abs(streamed - frames).max() > 1e-3  # it did filter


@pytest.mark.parametrize("chunk", [1, 5, 70])
def test_scene_cuts_found_as_the_whole_clip_finds_them(chunk: int):
    from digital_human.media.smoothing import detect_scene_cuts

    frames, mask = _clip()
    frames[30:] = np.clip(1.0 - frames[30:], 0, 1)  # a cut at 30
    frames[52:] = np.roll(frames[52:], 9, axis=2)   # and one at 52
    smoother = StreamingSmoother("one_euro", 0.5, 25.0, noise_level=0.01)
    for i in range(0, len(frames), chunk):
        smoother.push(torch.from_numpy(frames[i:i + chunk]), torch.from_numpy(mask))
    assert sorted(smoother.cuts) == detect_scene_cuts(frames) == [30, 52]
