"""Face detector + face mesh: conversion parity against LiteRT, and behaviour on real photos.

Models come from a mediapipe 0.10.21 wheel already on disk (DIGITAL_HUMAN_WHEELS, /tmp/mpwheel,
/tmp/dl) or from PyPI through install_face_models(); without either the tests skip with a reason.
"""
from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
import pytest

from digital_human.engines.face import detect
from digital_human.engines.face.blazeface import face_detector_spec
from digital_human.engines.face.facemesh import face_mesh_spec
from digital_human.engines.face.mediapipe_assets import face_model_paths
from digital_human.engines.face.tflite_reader import UnsupportedTflite, read_tflite

PORTRAITS = ["face_01_female.jpg", "face_02_male.png", "face_03_male.jpg", "face_04_zh_male_halfbody.jpeg"]


def _load_rgb(path: Path) -> np.ndarray:
    """Decode one still image with the ffmpeg that imageio-ffmpeg bundles (no Pillow needed here)."""
    imageio_ffmpeg = pytest.importorskip("imageio_ffmpeg")
    frames = imageio_ffmpeg.read_frames(str(path), pix_fmt="rgb24")
    width, height = next(frames)["size"]
    return np.frombuffer(next(frames), np.uint8).reshape(height, width, 3)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory, fresh_face_models) -> dict[str, Path]:
    with fresh_face_models(tmp_path_factory.mktemp("face_models")) as paths:
        yield paths


@pytest.fixture(scope="module")
def runners(models: dict[str, Path]) -> tuple[detect.Runner, detect.Runner]:
    # through the engine loader, as the nodes run them; ONNX Runtime CPU is what the parity is about
    # (default_runners() is process-cached, so build them from this module's model folder instead)
    return (detect.engine_runner(face_detector_spec(), backend="onnxruntime"),
            detect.engine_runner(face_mesh_spec(), backend="onnxruntime"))


def _faces_with_presence(image, runners, min_score=0.5):
    run_det, run_mesh = runners
    found = []
    for box in detect.detect_faces(image, run_det, min_score=min_score):
        landmarks, presence = detect.face_landmarks(image, box, run_mesh)
        found.append((box, landmarks, presence))
    return found


@pytest.mark.parametrize("name", PORTRAITS)
def test_one_face_on_each_portrait(name, data_dir, runners):
    image = _load_rgb(data_dir / "image" / name)
    found = _faces_with_presence(image, runners)
    assert len(found) == 1, f"{name}: expected one face, got {[(b.x0, b.y0, b.score) for b, _, _ in found]}"
    box, landmarks, presence = found[0]
    assert presence > 0.9 and box.score > 0.7
    assert landmarks.shape == (468, 3)
    # the mesh must lie on the detected face, and the subject's right eye appears left in the image
    centre = landmarks[:, :2].mean(0)
    assert box.x0 < centre[0] < box.x1 and box.y0 < centre[1] < box.y1
    assert box.keypoints[0, 0] < box.keypoints[1, 0]
    assert landmarks[33, 0] < landmarks[263, 0]  # mesh indices of the right / left outer eye corners


@pytest.mark.parametrize("name", ["neg_noface_landscape.png", "neg_noface_dino.jpg"])
def test_no_face_on_scenes(name, data_dir, runners):
    image = _load_rgb(data_dir / "image" / name)
    accepted = [presence for _, _, presence in _faces_with_presence(image, runners) if presence >= 0.5]
    assert not accepted, f"{name}: false faces with presence {accepted}"


def test_dog_is_rejected_by_presence_score(data_dir, runners):
    image = _load_rgb(data_dir / "image" / "neg_animal_dog.png")
    # a low detector threshold makes sure the mesh stage is the one doing the rejecting
    found = _faces_with_presence(image, runners, min_score=0.3)
    assert found, "the detector no longer fires on the dog; this test then checks nothing"
    assert max(presence for _, _, presence in found) < 0.5


def test_two_faces(data_dir, runners):
    image = _load_rgb(data_dir / "image" / "neg_two_faces.jpg")
    found = _faces_with_presence(image, runners)
    assert len(found) == 2 and all(presence > 0.9 for _, _, presence in found)
    (a, _, _), (b, _, _) = found
    assert a.x1 < b.x0 or b.x1 < a.x0, "the two boxes should be side by side"


def test_rotated_face_gives_the_same_landmarks(data_dir, runners):
    """The eye-line rotation of the crop is right: a 30-degree rotated photo maps back onto the
    upright landmarks within a few percent of the eye distance."""
    image = _load_rgb(data_dir / "image" / "face_02_male.png")  # square 512 x 512
    (_, upright, _), = _faces_with_presence(image, runners)
    angle = math.radians(30)
    c, s, half = math.cos(angle), math.sin(angle), image.shape[0] / 2
    rotated_to_original = np.array([[c, -s, half - c * half + s * half], [s, c, half - s * half - c * half]])
    rotated = detect.warp_affine(image, rotated_to_original, image.shape[0], "zero").round().astype(np.uint8)
    (_, landmarks, presence), = _faces_with_presence(rotated, runners)
    back = landmarks[:, :2] @ rotated_to_original[:, :2].T + rotated_to_original[:, 2]
    eye_distance = np.linalg.norm(upright[33, :2] - upright[263, :2])
    err = np.linalg.norm(back - upright[:, :2], axis=1)
    assert presence > 0.9
    assert err.mean() < 0.04 * eye_distance, f"mean landmark error {err.mean():.2f} px"


def test_onnx_matches_litert(data_dir, models, runners):
    """Raw outputs of our ONNX graphs vs the original .tflite under LiteRT, on the same inputs."""
    pytest.importorskip("ai_edge_litert", reason="ai-edge-litert (test-only) not installed")
    from ai_edge_litert.interpreter import Interpreter

    def litert(path):
        interp = Interpreter(model_path=str(path))
        interp.allocate_tensors()
        inp = interp.get_input_details()[0]["index"]
        outs = [d["index"] for d in interp.get_output_details()]

        def run(x):
            interp.set_tensor(inp, x)
            interp.invoke()
            return [interp.get_tensor(i) for i in outs]
        return run

    lite_det, lite_mesh = litert(models["detector_tflite"]), litert(models["mesh_tflite"])
    run_det, run_mesh = runners
    raw_det = raw_mesh = max_px = 0.0
    for name in PORTRAITS + ["neg_two_faces.jpg"]:
        image = _load_rgb(data_dir / "image" / name)
        tensor, _ = detect.detector_input(image)
        ours, ref = run_det(tensor), lite_det(tensor)
        raw_det = max(raw_det, np.abs(ours["regressors"] - ref[0]).max(), np.abs(ours["classificators"] - ref[1]).max())
        for box in detect.detect_faces(image, run_det):
            crop, crop_to_image = detect.mesh_input(image, box)
            ours, ref = run_mesh(crop), lite_mesh(crop)
            raw_mesh = max(raw_mesh, np.abs(ours["landmarks"].reshape(-1) - ref[0].reshape(-1)).max(),
                           abs(float(ours["face_flag"].reshape(-1)[0]) - float(ref[1].reshape(-1)[0])))
            a = detect.landmarks_to_image(ours["landmarks"][0], crop_to_image)
            b = detect.landmarks_to_image(ref[0].reshape(468, 3), crop_to_image)
            max_px = max(max_px, float(np.linalg.norm(a[:, :2] - b[:, :2], axis=1).max()))
    print(f"\nONNX vs LiteRT: detector raw max abs {raw_det:.2e}, mesh raw max abs {raw_mesh:.2e}, "
          f"landmarks max {max_px:.4f} image px")
    assert raw_det < 1e-2 and raw_mesh < 1e-2
    assert max_px < 1.0


def test_speed_report(data_dir, runners):
    """ms per frame on this CPU (reported; only a loose bound so a shared CI box does not flake)."""
    run_det, run_mesh = runners
    image = _load_rgb(data_dir / "image" / "face_04_zh_male_halfbody.jpeg")
    box = detect.detect_faces(image, run_det)[0]
    timings = {}
    for label, fn in (("detect", lambda: detect.detect_faces(image, run_det)),
                      ("mesh", lambda: detect.face_landmarks(image, box, run_mesh))):
        fn()
        start = time.perf_counter()
        for _ in range(5):
            fn()
        timings[label] = (time.perf_counter() - start) / 5 * 1000
    print(f"\n1152x2048 frame: detect {timings['detect']:.1f} ms, mesh {timings['mesh']:.1f} ms (CPU, onnxruntime)")
    assert timings["detect"] < 1000 and timings["mesh"] < 1000


def test_bad_images_are_refused_with_a_fix():
    with pytest.raises(ValueError, match="uint8"):
        detect.detector_input(np.zeros((64, 64, 3), np.float32))
    with pytest.raises(ValueError, match="alpha"):
        detect.detector_input(np.zeros((64, 64, 4), np.uint8))


def test_decoder_puts_a_zero_offset_box_on_its_anchor():
    regressors = np.zeros((896, 16), np.float32)
    regressors[:, 2:4] = 12.8  # 0.1 of the 128-px input
    logits = np.full((896, 1), -10.0, np.float32)
    logits[600] = 5.0
    (row, score), = detect.decode_detections(regressors, logits)
    anchor = detect.blazeface_anchors()[600]
    assert score == pytest.approx(1 / (1 + math.exp(-5.0)))
    np.testing.assert_allclose(row[:4], [anchor[0] - 0.05, anchor[1] - 0.05, anchor[0] + 0.05, anchor[1] + 0.05],
                               atol=1e-6)
    np.testing.assert_allclose(row[4:].reshape(6, 2), np.tile(anchor, (6, 1)), atol=1e-6)


def test_missing_models_say_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setenv("DIGITAL_HUMAN_MODELS", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="digital_human setup"):
        face_model_paths()


def test_reader_refuses_a_non_tflite_file(tmp_path):
    bogus = tmp_path / "model.tflite"
    bogus.write_bytes(b"\x00" * 64)
    with pytest.raises(UnsupportedTflite, match="TFL3"):
        read_tflite(bogus)
