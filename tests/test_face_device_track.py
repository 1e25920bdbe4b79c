"""The face tracker's device path (engines/face/device_track.py: the frame uploaded once, sampling + network as
one call) against detect.py's per-call device path, on torch's CPU (the same code a GPU runs, without the CUDA
graphs): per call with small stand-in networks, and whole tracks with the real face models."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from digital_human.engines.face import detect  # noqa: E402
from digital_human.engines.face.detect import FaceBox  # noqa: E402
from digital_human.engines.face.device_track import DeviceFaceModels, device_face_models  # noqa: E402
from digital_human.vision import track as track_mod  # noqa: E402


class _Mesh(torch.nn.Module):
    """Landmarks and a presence logit that depend on every input pixel (a fixed random projection), so a
    sampling difference shows in the outputs."""

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.proj = torch.nn.Parameter(torch.randn(3 * 16 * 16, 468 * 3, generator=g) * 0.05, requires_grad=False)

    def forward(self, x):
        pooled = torch.nn.functional.adaptive_avg_pool2d(x.permute(0, 3, 1, 2), 16).reshape(len(x), -1)
        lm = 96.0 + pooled @ self.proj
        return lm.reshape(-1, 468, 3), (pooled.mean(1, keepdim=True) - 0.4) * 10


class _Detector(torch.nn.Module):
    """Scores high on bright anchors' cells, boxes of a fixed size: a few detections with NMS to do."""

    def forward(self, x):
        cells16 = torch.nn.functional.avg_pool2d(x.permute(0, 3, 1, 2).mean(1, keepdim=True), 8)  # [1,1,16,16]
        cells8 = torch.nn.functional.avg_pool2d(cells16, 2)
        logit = torch.cat([cells16.reshape(1, -1, 1).repeat_interleave(2, 1),
                           cells8.reshape(1, -1, 1).repeat_interleave(6, 1)], 1) * 40 - 10
        reg = torch.zeros(1, 896, 16, dtype=x.dtype)
        reg[..., 2:4] = 30.0
        reg[..., 4:6] = -8.0
        reg[..., 6:8] = 8.0
        return reg + x.mean() * 0.01, logit


def _image(h: int, w: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w]
    smooth = 127 + 100 * np.sin(xx / 7.0)[..., None] * np.cos(yy / 11.0)[..., None] * np.array([1.0, 0.6, -0.8])
    img = np.clip(smooth + rng.normal(0, 20, (h, w, 3)), 0, 255)
    img[h // 3:h // 2, w // 4:w // 2] = 250  # a bright patch for the detector
    return img.astype(np.uint8)


def _device_runner(module, names):
    """A torch runner that takes device tensors, as engine_runner makes for torch on CUDA (here the CPU)."""
    def run(batch):
        with torch.inference_mode():
            x = batch if isinstance(batch, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(batch))
            return {k: v.numpy() for k, v in zip(names, module(x))}

    run.device = torch.device("cpu")
    return run


def _box(cx: float, cy: float, side: float, angle: float) -> FaceBox:
    c, s = np.cos(angle), np.sin(angle)
    kp = np.array([[cx - 30 * c, cy - 30 * s], [cx + 30 * c, cy + 30 * s]] + [[cx, cy]] * 4, np.float32)
    return FaceBox(cx - side / 2, cy - side / 2, cx + side / 2, cy + side / 2, 0.9, kp)


@pytest.mark.parametrize("shape", [(512, 512), (300, 700), (1080, 600)])
def test_device_calls_equal_per_call_path(shape):
    mesh, det = _Mesh().eval(), _Detector().eval()
    run_mesh = _device_runner(mesh, ["landmarks", "face_flag"])
    run_det = _device_runner(det, ["regressors", "classificators"])
    image = _image(*shape)
    models = DeviceFaceModels(det, mesh, *shape, "cpu", graphs=False)
    h, w = shape
    # inside, rotated, past the border (replicate), upscaled; the last shrinks 2x (pre-filter: delegated)
    for cx, cy, side, angle in ((w / 2, h / 2, 200.0, 0.0), (w * 0.45, h * 0.5, 150.0, 0.3),
                                (40.0, h - 30.0, 150.0, -0.5), (w / 2, h / 2, 60.0, 0.1),
                                (w / 2, h / 2, min(h, w) * 0.9, 0.05)):
        box = _box(cx, cy, side, angle)
        ref, p_ref = detect.face_landmarks(image, box, run_mesh)
        got, p = models.landmarks(image, box, run_mesh)
        assert np.abs(got - ref).max() < 2e-3  # px: only grid_sample's normalised coordinates differ
        assert abs(p - p_ref) < 1e-5
    ref_faces = detect.detect_faces(image, run_det)
    got_faces = models.detect(image)
    assert ref_faces and len(got_faces) == len(ref_faces)
    for a, b in zip(ref_faces, got_faces):  # the same region, blocks and grid: the same numbers
        np.testing.assert_allclose([b.x0, b.y0, b.x1, b.y1, b.score], [a.x0, a.y0, a.x1, a.y1, a.score], atol=1e-4)
        np.testing.assert_allclose(b.keypoints, a.keypoints, atol=1e-4)


def test_frame_uploaded_once_per_frame_object():
    mesh, det = _Mesh().eval(), _Detector().eval()
    models = DeviceFaceModels(det, mesh, 128, 160, "cpu", graphs=False)
    a, b = _image(128, 160, 1), _image(128, 160, 2)
    box = _box(80.0, 64.0, 70.0, 0.0)
    loads = []
    orig = models._load
    models._load = lambda f: (loads.append(f is models._last), orig(f))
    first = models.landmarks(a, box)
    models.detect(a)
    other = models.landmarks(b, box)
    again = models.landmarks(a.copy(), box)  # a new array object: uploaded again, the same pixels
    assert loads == [False, True, False, False]
    np.testing.assert_array_equal(first[0], again[0])
    assert np.abs(first[0] - other[0]).max() > 0  # the second frame's pixels were used
    with pytest.raises(ValueError, match="these graphs are for"):
        models.landmarks(_image(64, 64), box)


def test_only_torch_cuda_runners_get_device_models():
    def plain(batch):
        return {}

    assert device_face_models((plain, plain), 64, 64) is None
    plain.device = torch.device("cpu")  # a device runner without a live module (not the engine loader's)
    assert device_face_models((plain, plain), 64, 64) is None
    ops = track_mod.face_ops(np.zeros((3, 64, 64, 3), np.uint8), (plain, plain))
    assert type(ops) is track_mod.FaceOps


def test_device_track_equals_per_call_track(data_dir, setup_models):
    """Whole tracks (detection frames, mesh tracking, a re-detection) with the real face models as torch
    modules: the device path gives the per-call path's landmarks within float rounding."""
    from digital_human.engines.face.blazeface import FaceDetectorNet
    from digital_human.engines.face.facemesh import FaceMeshNet
    from digital_human.engines.face.mediapipe_assets import face_model_paths
    from digital_human.media.probe import read_video_frames

    paths = face_model_paths()
    det, mesh = FaceDetectorNet(paths["detector_tflite"]).eval(), FaceMeshNet(paths["mesh_tflite"]).eval()
    runners = (_device_runner(det, ["regressors", "classificators"]), _device_runner(mesh, ["landmarks", "face_flag"]))
    frames, _ = read_video_frames(data_dir / "video" / "talk_en_male_01a.mp4", max_frames=30)
    frames = frames.copy()
    frames[12] = 0  # a black frame: the face is lost (a cut each side) and detected again after it
    kwargs = dict(stride=4, face_index=0, min_presence=0.5, progress=None, detector=None)
    ref = track_mod._track_faces(frames, runners, **kwargs)
    models = DeviceFaceModels(det, mesh, *frames.shape[1:3], "cpu", graphs=False)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(track_mod, "face_ops", lambda f, r, d=None: track_mod.DeviceOps(models, *r, d))
        got = track_mod._track_faces(frames, runners, **kwargs)
    assert not ref.found[12] and ref.found.sum() == 29
    np.testing.assert_array_equal(got.found, ref.found)
    assert (got.detections, got.faces_seen, got.scene_cuts) == (ref.detections, ref.faces_seen, ref.scene_cuts)
    assert np.nanmax(np.abs(got.landmarks - ref.landmarks)) < 2e-3  # px
    assert np.abs(got.presence - ref.presence).max() < 1e-4
