"""The face models' input sampling on a torch device (engines/face/warp_torch.py) against the numpy path."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from digital_human.engines.face import detect  # noqa: E402
from digital_human.engines.face.detect import FaceBox, detector_input, mesh_input  # noqa: E402


def _image(h: int, w: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w]
    smooth = 127 + 100 * np.sin(xx / 7.0)[..., None] * np.cos(yy / 11.0)[..., None] * np.array([1.0, 0.6, -0.8])
    return np.clip(smooth + rng.normal(0, 20, (h, w, 3)), 0, 255).astype(np.uint8)


@pytest.mark.parametrize("shape", [(512, 512), (300, 700), (1080, 600)])
def test_detector_input_on_device_equals_numpy(shape):
    image = _image(*shape)
    ref, undo = detector_input(image)
    dev, undo_dev = detector_input(image, torch.device("cpu"))
    assert undo == undo_dev
    assert isinstance(dev, torch.Tensor) and tuple(dev.shape) == ref.shape
    assert np.abs(dev.numpy() - ref).max() < 2e-4  # [-1, 1] units: ~0.02 levels


@pytest.mark.parametrize("side,angle,centre", [(200.0, 0.0, (256, 256)), (380.0, 0.3, (250, 240)),
                                               (150.0, -0.5, (40, 470)), (600.0, 0.1, (300, 300))])
def test_mesh_input_on_device_equals_numpy(side, angle, centre):
    """Upscaled, rotated, past the border (replicate) and shrunk 2x+ (box pre-filter) crops."""
    image = _image(512, 512, 1)
    cx, cy = centre
    c, s = np.cos(angle), np.sin(angle)
    kp = np.array([[cx - 30 * c, cy - 30 * s], [cx + 30 * c, cy + 30 * s]] + [[cx, cy]] * 4, np.float32)
    box = FaceBox(cx - side / 2, cy - side / 2, cx + side / 2, cy + side / 2, 0.9, kp)
    ref, m_ref = mesh_input(image, box)
    dev, m_dev = mesh_input(image, box, torch.device("cpu"))
    np.testing.assert_array_equal(m_ref, m_dev)
    assert np.abs(dev.numpy() - ref).max() < 1e-4  # [0, 1] units: ~0.03 levels


def test_device_runner_gets_tensors():
    """A runner with a `device` is fed device tensors; face_landmarks' result equals the numpy runner's."""
    image = _image(256, 256, 2)
    box = FaceBox(60.0, 60.0, 190.0, 190.0, 0.9, np.array([[90, 110], [160, 110]] + [[125, 125]] * 4, np.float32))
    seen = []

    def run_np(batch):
        seen.append(type(batch))
        flat = np.asarray(batch, np.float32).reshape(-1)
        return {"landmarks": np.tile(flat[:3], (1, 468, 1)).astype(np.float32) * 100,
                "face_flag": np.array([[flat.mean() * 10]], np.float32)}

    def run_dev(batch):
        return run_np(batch.numpy())

    run_dev.device = torch.device("cpu")
    lm, p = detect.face_landmarks(image, box, run_np)
    lm_dev, p_dev = detect.face_landmarks(image, box, run_dev)
    assert seen[0] is np.ndarray
    assert np.abs(lm - lm_dev).max() < 1e-2 and abs(p - p_dev) < 1e-5
