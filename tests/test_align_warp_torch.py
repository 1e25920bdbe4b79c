"""FaceAlign's crops made on a torch device (vision/warp_torch.py, LazyCrops.many) against crop_frame."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from digital_human.vision.align import LazyCrops, affines_from_params, crop_frame  # noqa: E402
from digital_human.vision.warp_torch import crop_frames_torch  # noqa: E402


def _frames(n: int, h: int, w: int) -> np.ndarray:
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:h, 0:w]
    base = 127 + 90 * np.sin(xx / 9.0)[..., None] * np.cos(yy / 13.0)[..., None] * np.array([1.0, 0.5, -0.7])
    return np.stack([np.clip(base + rng.normal(0, 25, (h, w, 3)) + 3 * t, 0, 255) for t in range(n)]).astype(np.uint8)


def _affines(n: int, crop: int) -> np.ndarray:
    # face heights from 60 px (crop upscaled) to 400 px (shrunk 2-3x: the box pre-filter), rolled,
    # one centre near the corner (the window clipped, replicate border)
    params = np.array([[256, 250, np.log(60), 0.0], [250, 260, np.log(200), 0.2], [230, 280, np.log(300), -0.1],
                       [270, 240, np.log(400), 0.05], [20, 30, np.log(150), 0.4], [256, 256, np.log(301), 0.0]])
    return affines_from_params(params[:n], crop, 0.35)


@pytest.mark.parametrize("crop", [256, 512])
def test_crop_frames_torch_equals_crop_frame(crop):
    frames, affines = _frames(6, 512, 512), _affines(6, crop)
    ref = np.stack([crop_frame(f, a, crop) for f, a in zip(frames, affines)]).astype(int)
    got = crop_frames_torch(frames, affines, crop, torch.device("cpu")).numpy().astype(int)
    diff = np.abs(got - ref)
    # float32 sample positions vs OpenCV's: a level at most, on a few pixels (ties of the rounding)
    assert diff.max() <= 1 and (diff > 0).mean() < 0.01, (diff.max(), (diff > 0).mean())


class _Frames:
    """A stand-in for media.frame_source.VideoFrames (array-like, counts reads)."""

    def __init__(self, frames: np.ndarray):
        self.arr, self.reads = frames, 0
        self.shape = frames.shape

    def __len__(self) -> int:
        return len(self.arr)

    def __getitem__(self, key):
        self.reads += 1
        return self.arr[key]


def test_lazy_crops_many_on_a_device_equals_one_at_a_time():
    frames, affines = _frames(6, 512, 512), _affines(6, 256)
    lazy = LazyCrops(_Frames(frames), affines, 256)
    ref = np.stack([crop_frame(f, a, 256) for f, a in zip(frames, affines)])
    cpu = LazyCrops(_Frames(frames), affines, 256).many([3, 1, 3, 0])
    assert np.array_equal(cpu, ref[[3, 1, 3, 0]])  # no device: crop() per frame, exactly
    got = lazy.many([3, 1, 3, 0, 5, 2, 4], torch.device("cpu"))
    assert lazy.frames.reads == 1  # the missing frames read in one go
    assert np.abs(got.astype(int) - ref[[3, 1, 3, 0, 5, 2, 4]].astype(int)).max() <= 1
    assert np.array_equal(lazy[1], got[1])  # kept: later reads see the same crop
    again = lazy.many([1, 0], torch.device("cpu"))
    assert lazy.frames.reads == 1 and np.array_equal(again, got[[1, 3]])

