"""insightface (SCRFD) detector backend: pack lookup, strict graph check, decode math, end-to-end run.

The real packs are non-commercial and never downloaded; the tests build small RANDOM models with
SCRFD's I/O layout (one [1,3,640,640] input; scores/boxes/keypoints for strides 8/16/32)."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnxruntime")

from digital_human.engines.face import insightface_models as ifm  # noqa: E402
from digital_human.engines.face.detect import FaceBox, mesh_crop_transform  # noqa: E402
from digital_human.engines.onnx_export import export_onnx  # noqa: E402


class TinySCRFD(torch.nn.Module):
    """SCRFD's head layout on a trivial body: per stride a pooled 1x1-conv stem and three heads,
    flattened like insightface's export (location-major, 2 anchors per location, no batch axis)."""

    def __init__(self, strides: tuple[int, ...] = (8, 16, 32)) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.strides = strides
        self.stems = torch.nn.ModuleList(torch.nn.Conv2d(3, 8, 1) for _ in strides)
        self.score = torch.nn.ModuleList(torch.nn.Conv2d(8, 2, 1) for _ in strides)
        self.bbox = torch.nn.ModuleList(torch.nn.Conv2d(8, 8, 1) for _ in strides)
        self.kps = torch.nn.ModuleList(torch.nn.Conv2d(8, 20, 1) for _ in strides)

    def forward(self, x: torch.Tensor):
        scores, boxes, kps = [], [], []
        for i, s in enumerate(self.strides):
            f = torch.relu(self.stems[i](torch.nn.functional.avg_pool2d(x, s)))
            flat = lambda t, c: t.permute(0, 2, 3, 1).reshape(-1, c)  # noqa: E731
            scores.append(torch.sigmoid(flat(self.score[i](f), 1)))
            boxes.append(flat(torch.relu(self.bbox[i](f)) + 1.0, 4))
            kps.append(flat(self.kps[i](f), 10))
        return (*scores, *boxes, *kps)


def _export(path: Path, strides: tuple[int, ...] = (8, 16, 32)) -> Path:
    n = len(strides)
    names = [f"score_{s}" for s in strides] + [f"bbox_{s}" for s in strides] + [f"kps_{s}" for s in strides]
    assert len(names) == 3 * n
    return export_onnx(TinySCRFD(strides), (torch.zeros(1, 3, 640, 640),), path, ["input.1"], names)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return _export(tmp_path_factory.mktemp("scrfd") / "det.onnx")


@pytest.fixture()
def pack_root(tmp_path, monkeypatch, tiny_model) -> Path:
    root = tmp_path / "insightface" / "models"
    (root / "buffalo_l").mkdir(parents=True)
    (root / "buffalo_l" / "det_10g.onnx").write_bytes(tiny_model.read_bytes())
    monkeypatch.setenv(ifm.ENV_DIR, str(root))
    ifm.insightface_detector.cache_clear()
    yield root
    ifm.insightface_detector.cache_clear()


def test_pack_found_through_env_var(pack_root):
    assert ifm.insightface_pack_dir() == pack_root
    assert ifm.available_packs() == ["buffalo_l"]
    assert ifm.detector_path("buffalo_l") == pack_root / "buffalo_l" / "det_10g.onnx"


def test_nested_antelopev2_folder_is_accepted(pack_root, tiny_model):
    nested = pack_root / "antelopev2" / "antelopev2"
    nested.mkdir(parents=True)
    (nested / "scrfd_10g_bnkps.onnx").write_bytes(tiny_model.read_bytes())
    assert ifm.available_packs() == ["buffalo_l", "antelopev2"]


def test_missing_pack_names_folder_and_file(pack_root):
    with pytest.raises(FileNotFoundError) as err:
        ifm.insightface_detector("antelopev2")
    msg = str(err.value)
    assert "scrfd_10g_bnkps.onnx" in msg and str(pack_root / "antelopev2") in msg and "non-commercial" in msg
    with pytest.raises(ValueError, match="unknown insightface pack"):
        ifm.detector_path("../../etc")


def test_strict_check_refuses_six_outputs(pack_root, tmp_path):
    _export(pack_root / "buffalo_l" / "det_10g.onnx", strides=(8, 16))
    with pytest.raises(ifm.InsightfaceModelError, match="expected 9 outputs"):
        ifm.insightface_detector("buffalo_l")


def test_runtime_shape_check_refuses_wrong_head_layout():
    # heads sized for a 320x320 input (K = 3200/800/200) are not what a 640 run must give
    outs = {f"o{k}_{c}": np.zeros((k, c), np.float32) for k in (3200, 800, 200) for c in (1, 4, 10)}
    with pytest.raises(ifm.InsightfaceModelError, match="shapes"):
        ifm.sort_outputs(outs)
    outs = {f"o{i}": np.zeros((100, 1), np.float32) for i in range(2)}  # two heads alike
    with pytest.raises(ifm.InsightfaceModelError, match="unexpected shape"):
        ifm.sort_outputs(outs)


def _blank_outputs() -> dict[str, np.ndarray]:
    outs = {}
    for s, k in ifm.expected_anchor_counts().items():
        outs[f"score{s}"] = np.zeros((k, 1), np.float32)
        outs[f"box{s}"] = np.zeros((k, 4), np.float32)
        outs[f"kps{s}"] = np.zeros((1, k, 10), np.float32)  # batched layout is accepted too
    return outs


def _set(outs, stride, gx, gy, anchor, score, box, kps=None):
    cells = 640 // stride
    i = (gy * cells + gx) * 2 + anchor  # location-major, 2 anchors per location
    outs[f"score{stride}"][i, 0] = score
    outs[f"box{stride}"][i] = box
    if kps is not None:
        outs[f"kps{stride}"][0, i] = kps


def test_decode_positions_and_nms():
    outs = _blank_outputs()
    # stride 16, grid (3, 5) -> centre (48, 80); distances x16
    kps = [-1, -1, 1, -1, 0, 0, -0.5, 1, 0.5, 1]
    _set(outs, 16, 3, 5, 1, 0.9, [1, 2, 3, 4], kps)
    # overlapping, weaker (stride 8 at (6, 10) -> centre (48, 80), same box): suppressed by NMS
    _set(outs, 8, 6, 10, 0, 0.8, [2, 4, 6, 8])
    # far away, kept: stride 32 at (15, 15) -> centre (480, 480)
    _set(outs, 32, 15, 15, 0, 0.7, [1, 1, 1, 1])
    # under the score threshold: ignored
    _set(outs, 32, 2, 2, 0, 0.49, [1, 1, 1, 1])
    boxes, scores, k = ifm.decode(ifm.sort_outputs(_blank_outputs() | outs))
    np.testing.assert_allclose(scores, [0.9, 0.7], atol=1e-6)
    np.testing.assert_allclose(boxes[0], [48 - 16, 80 - 32, 48 + 48, 80 + 64])
    np.testing.assert_allclose(boxes[1], [448, 448, 512, 512])
    np.testing.assert_allclose(k[0], [[32, 64], [64, 64], [48, 80], [40, 96], [56, 96]])

    # back to image pixels of a 1280x960 photo (scale 0.5): everything doubles, order and mapping kept
    faces = ifm.faces_from_outputs(outs, 0.5, (960, 1280, 3))
    assert len(faces) == 2 and isinstance(faces[0], FaceBox)
    f = faces[0]
    np.testing.assert_allclose([f.x0, f.y0, f.x1, f.y1], [64, 96, 192, 288])
    np.testing.assert_allclose(f.keypoints[:4], [[64, 128], [128, 128], [96, 160], [96, 192]])


def test_keypoint_convention_matches_detect_py():
    # frontal face: SCRFD point 0 is the image-left eye = the subject's right eye = detect.py keypoint 0
    kps5 = np.array([[40, 50], [80, 50], [60, 70], [45, 90], [75, 90]], float)
    f = ifm.to_facebox(np.array([20, 20, 100, 110]), 0.9, kps5)
    r_eye, l_eye, nose, mouth, r_ear, l_ear = f.keypoints
    assert r_eye[0] < l_eye[0] and tuple(nose) == (60, 70) and tuple(mouth) == (60, 90)
    np.testing.assert_allclose(r_ear, [20, 60])  # box's left side, a quarter eye->mouth below the eyes
    np.testing.assert_allclose(l_ear, [100, 60])
    # mesh crop built from it is upright (rotation from keypoint 0 -> 1 is zero)
    m = mesh_crop_transform(f)
    assert abs(m[1, 0]) < 1e-9 and m[0, 0] > 0

    # face rolled 90 deg clockwise in the image (eye line pointing down): ears follow the eye line
    rot = np.array([[0, -1], [1, 0]], float)
    c = np.array([60, 60])
    kr = (kps5 - c) @ rot.T + c
    g = ifm.to_facebox(np.array([10, 20, 100, 100]), 0.9, kr)
    angle = math.degrees(math.atan2(*(g.keypoints[1] - g.keypoints[0])[::-1]))
    assert abs(angle - 90) < 1e-6
    assert g.keypoints[4][1] < g.keypoints[0][1] and g.keypoints[5][1] > g.keypoints[1][1]


def test_letterbox_input():
    img = np.full((100, 200, 3), 255, np.uint8)
    t, scale = ifm.detector_input(img)
    assert t.shape == (1, 3, 640, 640) and t.dtype == np.float32 and scale == pytest.approx(3.2)
    assert t[0, :, :320, :].min() == pytest.approx(127.5 / 128)  # image at top-left, edges not darkened
    assert t[0, :, 320:, :].max() == pytest.approx(-127.5 / 128)  # black pad below
    with pytest.raises(ValueError, match="RGB"):
        ifm.detector_input(np.zeros((10, 10), np.uint8))


def test_detector_runs_on_real_photo(pack_root, data_dir):
    from PIL import Image

    with Image.open(data_dir / "image" / "face_01_female.jpg") as im:
        img = np.asarray(im.convert("RGB"))
    detect = ifm.insightface_detector("buffalo_l", backend="onnxruntime")
    faces = detect(img)
    h, w = img.shape[:2]
    assert faces  # the seeded random model fires on this photo; an empty list would make the checks vacuous
    assert [f.score for f in faces] == sorted((f.score for f in faces), reverse=True)
    for f in faces:
        assert 0 <= f.x0 < f.x1 <= w and 0 <= f.y0 < f.y1 <= h and 0.5 <= f.score <= 1
        assert f.keypoints.shape == (6, 2) and np.isfinite(f.keypoints).all()


def test_face_align_node_uses_the_insightface_detector(tmp_path, monkeypatch, data_dir, setup_models):
    """FaceAlign(detector="insightface:buffalo_l") runs the SCRFD boxes through the mesh check; a missing pack
    is a clear error naming the folder."""
    from PIL import Image

    from digital_human.nodes.image_convert import uint8_to_image
    from digital_human.nodes.video_nodes import FaceAlign

    monkeypatch.setenv("DIGITAL_HUMAN_INSIGHTFACE_DIR", str(tmp_path / "insightface" / "models"))
    with Image.open(data_dir / "image" / "face_01_female.jpg") as img:
        image = uint8_to_image(np.asarray(img.convert("RGB"))[None])
    with pytest.raises(FileNotFoundError, match="det_10g.onnx"):
        FaceAlign().align(image, detector="insightface:buffalo_l")
    with pytest.raises(ValueError, match="detector must be"):
        FaceAlign().align(image, detector="dlib")
