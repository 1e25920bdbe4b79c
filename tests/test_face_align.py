"""FaceAlign logic (vision/): main-face choice, rejection of non-faces, video tracking, gap
filling, crop smoothing, DH_FACES persistence. Real photos and clips from the sample data.

Models are the ones `digital-human setup` installed (the `face_runners` fixture in conftest.py
skips with a reason, or fails in CI, when they are missing).
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from digital_human.vision import FaceTrack, NoFaceError, align_faces, draw_preview
from digital_human.vision.align import TEMPLATE_INDEX, TEMPLATE_XY
from digital_human.vision.track import crop_jitter

PORTRAITS = ["face_01_female.jpg", "face_02_male.png", "face_03_male.jpg", "face_04_zh_male_halfbody.jpeg"]


def _load_rgb(path: Path) -> np.ndarray:
    imageio_ffmpeg = pytest.importorskip("imageio_ffmpeg")
    frames = imageio_ffmpeg.read_frames(str(path), pix_fmt="rgb24")
    width, height = next(frames)["size"]
    return np.frombuffer(next(frames), np.uint8).reshape(height, width, 3).copy()


def _video(data_dir: Path, name: str, n: int) -> tuple[np.ndarray, float]:
    from digital_human.media.probe import read_video_frames

    return read_video_frames(data_dir / "video" / name, max_frames=n)


@pytest.fixture(scope="module")
def runners(face_runners):
    return face_runners


def _crop_geometry_ok(track: FaceTrack, t: int = 0) -> None:
    """The crop is upright, centred, and has the whole face (chin included) inside with room."""
    lm = track.crop_landmarks()[t]
    s = track.crop_size
    eye_r, eye_l, mouth, chin = lm[33], lm[263], (lm[13] + lm[14]) / 2, lm[152]
    assert eye_r[0] < eye_l[0], "subject's right eye must be on the image left"
    assert abs(eye_r[1] - eye_l[1]) < 0.03 * s, "eye line not level"
    assert eye_r[1] < mouth[1] < chin[1]
    assert abs((eye_r[0] + eye_l[0]) / 2 - s / 2) < 0.06 * s, "face not centred horizontally"
    assert chin[1] < 0.9 * s and lm[:, 1].min() > 0.05 * s, "face not inside the crop with a margin"
    # the rigid points sit on the template (a similarity fit, so up to the face's own shape)
    expected = TEMPLATE_XY * s / (1 + 2 * track.expand) + s / 2
    assert np.mean(np.linalg.norm(lm[TEMPLATE_INDEX] - expected, axis=1)) < 0.03 * s


@pytest.mark.parametrize("name", PORTRAITS)
def test_one_face_on_each_portrait(name, data_dir, runners):
    track = align_faces(_load_rgb(data_dir / "image" / name), 0, runners=runners, input_name=name)
    assert track.found.tolist() == [True] and track.presence[0] > 0.9
    assert track.crops.shape == (1, 256, 256, 3) and track.crops.dtype == np.uint8
    assert track.warnings == [] and track.max_faces_seen == 1
    _crop_geometry_ok(track)


@pytest.mark.parametrize("name", ["neg_noface_landscape.png", "neg_noface_dino.jpg", "neg_animal_dog.png"])
def test_no_face_is_a_clear_error(name, data_dir, runners):
    with pytest.raises(NoFaceError, match=f"no face found in the photo of {name}; use a photo/video"):
        align_faces(_load_rgb(data_dir / "image" / name), 0, runners=runners, input_name=name)


def test_two_faces_pick_by_size_and_index(data_dir, runners):
    image = _load_rgb(data_dir / "image" / "neg_two_faces.jpg")
    first = align_faces(image, 0, runners=runners, crop_size=512)
    second = align_faces(image, 0, runners=runners, face_index=1, crop_size=512)
    area = lambda b: (b[2] - b[0]) * (b[3] - b[1])  # noqa: E731
    assert area(first.boxes[0]) > area(second.boxes[0])
    centre = lambda b: np.array([(b[0] + b[2]) / 2, (b[1] + b[3]) / 2])  # noqa: E731
    assert np.linalg.norm(centre(first.boxes[0]) - centre(second.boxes[0])) > 100
    for track in (first, second):
        assert track.max_faces_seen == 2 and any("2 faces seen" in w for w in track.warnings)
        _crop_geometry_ok(track)
    with pytest.raises(NoFaceError, match="face_index 2 .* at most 2 face"):
        align_faces(image, 0, runners=runners, face_index=2)


@pytest.mark.parametrize("name", ["talk_en_male_01a.mp4", "talk_xx_female_05_1080x1920_hevc.mp4"])
def test_talking_videos_are_found_and_timed(name, data_dir, runners):
    frames, fps = _video(data_dir, name, 60)
    start = time.perf_counter()
    track = align_faces(frames, fps, runners=runners, input_name=name)
    ms = (time.perf_counter() - start) / len(frames) * 1000
    print(f"\n{name} {frames.shape[2]}x{frames.shape[1]}: align {ms:.1f} ms/frame (CPU); {track.summary()}")
    assert track.found.mean() >= 0.99
    assert track.crops.shape == (60, 256, 256, 3) and track.fps == pytest.approx(fps)
    assert np.isfinite(track.affines).all() and np.isfinite(track.landmarks).all()
    for t in (0, 30, 59):
        _crop_geometry_ok(track, t)


def test_multishot_multiface_clip_reports_counts(data_dir, runners):
    frames, fps = _video(data_dir, "neg_multishot_multiface.mp4", 90)
    track = align_faces(frames, fps, runners=runners, input_name="neg_multishot_multiface.mp4")
    print("\n" + track.summary())
    n_found = int(track.found.sum())
    assert 0 < n_found < len(frames)  # wide shot with ~20-px faces and a profile close-up: most missed
    assert track.interpolated_count == len(frames) - n_found
    assert track.scene_cuts, "the clip has shot changes"
    assert any(f"no face in {len(frames) - n_found} of {len(frames)} frames" in w for w in track.warnings)
    assert np.isfinite(track.affines).all()


def test_smoothing_removes_jitter_without_lag(data_dir, runners):
    frames, fps = _video(data_dir, "talk_en_male_01a.mp4", 90)
    smooth = align_faces(frames, fps, runners=runners)
    raw = align_faces(frames, fps, runners=runners, stride=1, smoothing=0)  # per-frame detection
    j_smooth, j_raw = crop_jitter(smooth.affines, 256), crop_jitter(raw.affines, 256)
    print(f"\ncrop jitter (mean |2nd diff| of crop corners, crop px): raw {j_raw:.3f}, smoothed {j_smooth:.3f} "
          f"({100 * (1 - j_smooth / j_raw):.0f}% lower)")
    assert j_smooth <= 0.5 * j_raw
    # no lag: the smoothed crop centre lines up with the raw one best at zero shift
    def centre(tr):
        inv = tr.inverse_affines()
        return inv[:, :, :2] @ np.array([128.0, 128.0]) + inv[:, :, 2]

    cs, cr = centre(smooth), centre(raw)
    errors = {k: np.mean(np.linalg.norm(cs[5 + k:85 + k] - cr[5:85], axis=1)) for k in range(-3, 4)}
    assert min(errors, key=errors.get) == 0, errors
    # and still follows the face: mean offset of the rigid points from the template < 2% of the crop
    expected = TEMPLATE_XY * 256 / 1.7 + 128
    offset = np.linalg.norm(smooth.crop_landmarks()[:, TEMPLATE_INDEX] - expected, axis=-1).mean()
    assert offset < 0.02 * 256


def test_black_frame_gets_an_interpolated_transform(data_dir, runners):
    frames, fps = _video(data_dir, "talk_en_male_01a.mp4", 30)
    frames = frames.copy()
    frames[15] = 0
    track = align_faces(frames, fps, runners=runners, smoothing=0)
    assert not track.found[15] and track.found[np.arange(30) != 15].all()
    assert track.interpolated_count == 1 and any("frames 15)" in w for w in track.warnings)
    # linear in the transform parameters: the crop centre of frame 15 is midway between 14 and 16
    inv = track.inverse_affines()
    centre = inv[:, :, :2] @ np.array([128.0, 128.0]) + inv[:, :, 2]
    assert np.linalg.norm(centre[15] - (centre[14] + centre[16]) / 2) < 0.5
    assert np.allclose(track.landmarks[15], (track.landmarks[14] + track.landmarks[16]) / 2, atol=0.5)


def test_dh_faces_save_load_and_preview(data_dir, runners, tmp_path):
    frames, fps = _video(data_dir, "talk_en_male_01a.mp4", 8)
    track = align_faces(frames, fps, runners=runners, crop_size=512)
    path = track.save_npz(tmp_path / "faces.npz")
    back = FaceTrack.load_npz(path)
    for name in ("frames", "found", "boxes", "landmarks", "affines", "presence", "crops"):
        np.testing.assert_array_equal(getattr(back, name), getattr(track, name))
    assert (back.fps, back.crop_size, back.warnings, back.expand) == (track.fps, 512, track.warnings, track.expand)
    np.testing.assert_allclose(back.crop_landmarks(), track.crop_landmarks())
    eye = np.rint(track.crop_landmarks()[0, 33] - 0.5).astype(int)
    preview = draw_preview(track)
    assert preview.shape == (8, 512, 512, 3) and tuple(preview[0, eye[1], eye[0]]) == (0, 255, 0)
    assert np.array_equal(draw_preview(track, landmarks=False), track.crops)


def test_bad_inputs_name_the_input_and_the_fix(runners):
    with pytest.raises(ValueError, match=r"my_video must be RGB frames \[N, H, W, 3\]"):
        align_faces(np.zeros((4, 64, 64), np.uint8), 25, runners=runners, input_name="my_video")
    with pytest.raises(ValueError, match="crop_size"):
        align_faces(np.zeros((64, 64, 3), np.uint8), 25, runners=runners, crop_size=10)
    with pytest.raises(NoFaceError, match="any of the 3 frames of clip"):
        align_faces(np.zeros((3, 64, 64, 3), np.float32), 25, runners=runners, input_name="clip")  # float 0..1 ok


def test_crop_landmarks_per_frame_equal_the_whole_array():
    """The renderers read crop landmarks per frame (CropLandmarks) so a long video's whole array is never
    made; the values must be exactly the whole array's."""
    from digital_human.vision.faces import CropLandmarks, FaceTrack

    rng = np.random.default_rng(0)
    n = 7
    affines = np.concatenate([rng.normal(size=(n, 2, 2)), rng.normal(size=(n, 2, 1)) * 50], -1)
    landmarks = (rng.normal(size=(n, 468, 3)) * 100).astype(np.float32)
    track = FaceTrack(frames=np.zeros((n, 4, 4, 3), np.uint8), fps=25.0, crop_size=256, found=np.ones(n, bool),
                      boxes=np.zeros((n, 4), np.float32), landmarks=landmarks, affines=affines,
                      presence=np.ones(n, np.float32), crops=np.zeros((n, 8, 8, 3), np.uint8))
    whole, lazy = track.crop_landmarks(), CropLandmarks(track)
    assert len(lazy) == n
    for r in range(n):
        assert lazy[r].dtype == np.float32 and np.array_equal(lazy[np.int64(r)], whole[r])


def test_box_prefilter_equals_numpy_block_mean():
    """The shrinking pre-filter's fast uint8 block sum gives numpy's block mean exactly, at every factor
    (including white pixels at the uint16 sum's limit, 16 x 16 x 255), and float input keeps numpy's mean."""
    from digital_human.vision.align import _box_mean

    rng = np.random.default_rng(3)
    for k in (2, 3, 5, 16, 17):
        region = rng.integers(0, 256, (5 * k + 3, 4 * k + 1, 3), dtype=np.uint8)
        region[:k, :k] = 255
        rh, rw = region.shape[0] // k * k, region.shape[1] // k * k
        expected = region[:rh, :rw].astype(np.float32).reshape(rh // k, k, rw // k, k, -1).mean(axis=(1, 3))
        got = _box_mean(region, k)
        assert got.dtype == np.float32 and np.array_equal(got, expected), k
    floats = rng.random((12, 9, 1), dtype=np.float32)
    assert np.array_equal(_box_mean(floats, 3), floats[:12, :9].reshape(4, 3, 3, 3, 1).mean(axis=(1, 3)))
